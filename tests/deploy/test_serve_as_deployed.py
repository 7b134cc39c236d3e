"""The API started exactly as the Deployment and the compose replicas start it — their
command line and environment, read from the manifests — after the migration Job's command
(the `deployed_db` fixture), on a private Postgres database and Redis prefix. Only the bind
address and port change (127.0.0.1 and a free port instead of 0.0.0.0:8000), and only the
database and Redis locations in the environment."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from idempay_tools.serve_process import free_port
from tests.deploy.manifests import (
    DEPLOY,
    clean_environ,
    compose,
    compose_argv,
    container,
    container_env,
    dockerfile_stages,
    find,
    k8s_argv,
    render_base,
    render_local,
)
from tests.deploy.running import COMPOSE_ENV, empty_workdir, image_env, overrides
from tests.support.eventually import eventually

ENTRYPOINT = dockerfile_stages(DEPLOY / "Dockerfile")[-1].exec_form("ENTRYPOINT")
DEPLOYED = [
    "idempay",
    "serve",
    "--host",
    "0.0.0.0",
    "--port",
    "8000",
    "--workers",
    "2",
    "--no-migrate",
]


def _deployment() -> tuple[list[str], dict[str, str], dict[str, str]]:
    """The API container's command line, environment and probe paths (local overlay: the
    base plus a generated Secret; the base's container is the same)."""
    docs = render_local()
    api = find(docs, "Deployment", "idempay-api")
    spec = container(api, "api")
    base_spec = container(find(render_base(), "Deployment", "idempay-api"), "api")
    assert k8s_argv(spec, ENTRYPOINT) == k8s_argv(base_spec, ENTRYPOINT)
    probes = {
        "readiness": spec["readinessProbe"]["httpGet"]["path"],
        "liveness": spec["livenessProbe"]["httpGet"]["path"],
    }
    return k8s_argv(spec, ENTRYPOINT), container_env(docs, api, spec), probes


def _compose() -> tuple[list[str], dict[str, str], dict[str, str]]:
    service = compose(COMPOSE_ENV)["services"]["api-1"]
    check = " ".join(service["healthcheck"]["test"])
    probes = {"readiness": "/readyz" if "/readyz" in check else "?", "liveness": "/healthz"}
    return compose_argv(service, ENTRYPOINT), dict(service["environment"]), probes


SOURCES = {"deployment": _deployment, "compose": _compose}


def _local(argv: list[str], port: int) -> list[str]:
    """The deployed command line with only the bind address and port made local."""
    local = list(argv)
    local[local.index("--host") + 1] = "127.0.0.1"
    local[local.index("--port") + 1] = str(port)
    return local


def _wait_ready(proc: subprocess.Popen[bytes], url: str, log: Path) -> httpx.Response:
    def probe() -> httpx.Response:
        if proc.poll() is not None:  # not worth waiting for: fail at once
            raise AssertionError(f"server exited {proc.returncode}: {log.read_text()[-3000:]}")
        return httpx.get(url, timeout=2.0)

    try:
        return eventually(
            probe,
            until=lambda response: response.status_code == 200,
            what=f"{url} to answer 200",
            timeout=60,
            interval=0.2,
            ignoring=(httpx.HTTPError,),
        )
    except AssertionError as failure:
        if proc.poll() is not None:
            raise
        raise AssertionError(f"{failure}\n{log.read_text()[-3000:]}") from None


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_api_reaches_ready_as_deployed(
    source: str, deployed_db: str, redis_prefix: str, tmp_path: Path
) -> None:
    argv, env, probes = SOURCES[source]()
    assert argv == DEPLOYED
    port = free_port()
    run_env = {**clean_environ(), **image_env(), **env, **overrides(deployed_db, redis_prefix)}
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            _local(argv, port),
            env=run_env,
            cwd=empty_workdir(tmp_path),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        base = f"http://127.0.0.1:{port}"
        ready = _wait_ready(proc, f"{base}{probes['readiness']}", log)
        body: dict[str, Any] = ready.json()
        assert body == {"status": "ok", "checks": {"database": "ok", "redis": "ok"}}
        assert httpx.get(f"{base}{probes['liveness']}", timeout=2.0).json() == {"status": "ok"}
        metrics = httpx.get(f"{base}/metrics", timeout=2.0)
        assert metrics.status_code == 200 and "idempay_requests_total" in metrics.text
    finally:
        _stop(proc)
    assert proc.returncode == 0, log.read_text()[-3000:]
