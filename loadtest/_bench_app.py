"""The bench's own server: idempay's app plus the benchmark baseline, a create with the
idempotency layer bypassed (``POST /_bench/transactions``).

The route is mounted here, not in ``api/``: the baseline skips the failed-authentication
limiter and has no idempotency (a lost answer is never reversed), so no setting of the
server can mount it. What it does is ``api.bench_baseline.create_bypassed`` (the create's
steps minus idempotency; that module says which). `make bench` serves this app (``python -m
loadtest._bench_app``, with the options of ``idempay serve``) and compares idempay's create
against the baseline, side by side in one run.
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import tempfile

from fastapi import APIRouter, FastAPI

from api.bench_baseline import create_bypassed
from api.config import Settings
from api.main import create_app
from loadtest import _gc_trace

router = APIRouter(prefix="/_bench", include_in_schema=False)
router.add_api_route("/transactions", create_bypassed, methods=["POST"])
WORKER_HEALTHCHECK_S = 60


def app_factory() -> FastAPI:
    """``create_app`` with the baseline mounted (reads IDEMPAY_* once, like the server);
    the GC trace installed when ``--profile`` asks for it (``loadtest/_gc_trace.py``)."""
    _gc_trace.install_from_environment()
    app = create_app(Settings())
    app.include_router(router)
    return app


def main(argv: list[str] | None = None) -> None:
    """Serve ``app_factory`` with the options of ``idempay serve`` (api/cli.py), on a
    database the bench has already migrated."""
    import uvicorn

    parser = argparse.ArgumentParser(prog="python -m loadtest._bench_app")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args(argv)
    if args.workers > 1 and "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
        # As `idempay serve` does: /metrics sums every worker's counters (the bench reads
        # the group commit's writes per commit from them), not one worker's at random.
        folder = tempfile.mkdtemp(prefix="idempay-bench-metrics-")
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = folder
    uvicorn.run(
        "loadtest._bench_app:app_factory",
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        loop="uvloop",
        http="api.http_limits:SlowClientHttpToolsProtocol",
        access_log=False,
        log_level="warning",
        timeout_keep_alive=30,
        timeout_graceful_shutdown=10,
        # uvicorn's supervisor kills a worker that misses a 5 s health ping; on a loaded
        # shared machine a worker still importing misses it and is restarted for ever
        timeout_worker_healthcheck=WORKER_HEALTHCHECK_S,
    )


if __name__ == "__main__":
    main()
