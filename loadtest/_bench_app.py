"""The bench's own server: idempay's app plus the benchmark baseline, a create with the
idempotency layer bypassed (``POST /_bench/transactions``).

The baseline lives here, not in ``api/``: it skips the failed-authentication limiter and has
no idempotency (a lost answer is never reversed), so no setting of the server can mount it.
`make bench` serves this app (``python -m loadtest._bench_app``, with the options of
``idempay serve``) and compares idempay's create against the baseline, side by side in one
run. The baseline does the same work as a create minus idempotency: auth, rate limit, body
checks, one 0200 through the server's own acquirer link (no transaction open), then the
transaction, ledger and outbox inserts in one transaction — no claim, no key row, no stored
response, no request event: one commit where the create has two.
"""

from __future__ import annotations

import argparse

from fastapi import APIRouter, FastAPI, Request
from starlette.responses import Response

from api.acquirer.types import AcquirerError
from api.config import Settings
from api.context import AppContext
from api.db import atomic, utcnow
from api.errors import ApiError, ServiceUnavailableError, problem_response
from api.idempotency.keys import parse_key
from api.main import create_app
from api.outbox import writer as outbox
from api.transactions import repository
from api.transactions.http import decode, read_body

router = APIRouter(prefix="/_bench", include_in_schema=False)
WORKER_HEALTHCHECK_S = 60


@router.post("/transactions")
async def create_bypassed(request: Request) -> Response:
    ctx: AppContext = request.app.state.ctx
    service = ctx.service
    try:
        merchant_id, key_hash = await ctx.auth.merchant_for(request.headers.get("authorization"))
        await ctx.limiter.check(key_hash)
        key = parse_key(request.headers.get("idempotency-key"))
        body = decode(await read_body(request))
        await ctx.limiter.check(key_hash, body.terminal_id)
    except ApiError as error:
        return problem_response(error, retry_after_seconds=ctx.settings.retry_after_seconds)
    now = utcnow()
    try:
        auth = await service.acquirer.authorize(
            service.auth_request(merchant_id, key, body),
            timeout_s=ctx.settings.acquirer_timeout,
        )
    except AcquirerError as exc:  # no verdict: the baseline keeps nothing and says so
        unavailable = ServiceUnavailableError(f"acquirer: {type(exc).__name__}")
        return problem_response(unavailable, retry_after_seconds=ctx.settings.retry_after_seconds)
    txn = service.new_transaction(merchant_id, key, body, auth, created_at=now)
    text = repository.render(txn)
    async with atomic(service.engine) as conn:
        await repository.insert_transaction(conn, txn)
        await outbox.append(
            conn,
            merchant_id=merchant_id,
            event_type=outbox.COMPLETED,
            transaction_id=key,
            data=repository.body_of(txn),
            now=txn.processed_at,
        )
    return Response(text.encode(), 201, media_type="application/json")


def app_factory() -> FastAPI:
    """``create_app`` with the baseline mounted (reads IDEMPAY_* once, like the server)."""
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
