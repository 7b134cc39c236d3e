"""The API started exactly as the Deployment and the compose replicas start it — their
command line and environment, read from the manifests — after the migration Job's command
(the `deployed_db` fixture), on a private Postgres database and Redis prefix, talking to the
acquirer-sim started as its Deployment and its compose service start it. Only the bind
addresses and ports change (127.0.0.1 and free ports instead of 0.0.0.0:8000 and :8583), the
acquirer's store path (a temporary folder instead of the volume at /data), and only the
database, Redis and acquirer locations in the environment."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from api.acquirer.host import store as acquirer_store
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
from tests.deploy.running import COMPOSE_ENV, empty_workdir, image_env, overrides, run_to_the_end
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
DEPLOYED_ACQUIRER = [
    "idempay",
    "acquirer",
    "--host",
    "0.0.0.0",
    "--port",
    "8583",
    "--store",
    "/data/acquirer.sqlite3",
]


def _acquirer_deployment() -> tuple[list[str], dict[str, str], list[str]]:
    """The acquirer-sim container's command line, environment and readiness command."""
    docs = render_local()
    doc = find(docs, "Deployment", "idempay-acquirer-sim")
    spec = container(doc, "acquirer")
    base = container(find(render_base(), "Deployment", "idempay-acquirer-sim"), "acquirer")
    assert k8s_argv(spec, ENTRYPOINT) == k8s_argv(base, ENTRYPOINT)
    check = list(spec["readinessProbe"]["exec"]["command"])
    return k8s_argv(spec, ENTRYPOINT), container_env(docs, doc, spec), check


def _acquirer_compose() -> tuple[list[str], dict[str, str], list[str]]:
    service = compose(COMPOSE_ENV)["services"]["acquirer-sim"]
    test = list(service["healthcheck"]["test"])
    assert test[0] == "CMD"
    return compose_argv(service, ENTRYPOINT), dict(service["environment"]), test[1:]


ACQUIRER_SOURCES = {"deployment": _acquirer_deployment, "compose": _acquirer_compose}


@dataclass
class Acquirer:
    url: str
    port: int
    store: Path
    check: list[str]  # the deployed health check, pointed at ``port``
    env: dict[str, str]


def _local_check(check: list[str], port: int) -> list[str]:
    """The health check with the deployed port (8583) made the local one."""
    assert sum(arg.count("sign_on(8583)") for arg in check) == 1, check
    return [arg.replace("sign_on(8583)", f"sign_on({port})") for arg in check]


@pytest.fixture
def acquirer_sim(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Acquirer]:
    """The acquirer-sim as deployed by the source ``request.param`` names (its command line
    and environment), on a free loopback port with its store in a temporary folder; stopped
    (SIGTERM) afterwards."""
    argv, env, check = ACQUIRER_SOURCES[request.param]()
    assert argv == DEPLOYED_ACQUIRER
    port = free_port()
    store = tmp_path / "acquirer-data" / "acquirer.sqlite3"
    store.parent.mkdir()
    local = _local(argv, port)
    local[local.index("--store") + 1] = str(store)
    run_env = {**clean_environ(), **image_env(), **env}
    log = tmp_path / "acquirer.log"
    proc = _spawn(local, run_env, tmp_path, log)
    try:
        listening = eventually(
            lambda: re.search(r"listening on (iso8583://\S+)", log.read_text()),
            until=lambda found: found is not None or proc.poll() is not None,
            what="the acquirer-sim to listen",
            timeout=60,
            interval=0.1,
        )
        assert proc.poll() is None and listening, log.read_text()[-3000:]
        assert listening.group(1) == f"iso8583://127.0.0.1:{port}"
        yield Acquirer(listening.group(1), port, store, _local_check(check, port), run_env)
    finally:
        _stop(proc)
    assert proc.returncode == 0, log.read_text()[-3000:]


@pytest.mark.parametrize("acquirer_sim", sorted(ACQUIRER_SOURCES), indirect=True)
def test_the_acquirer_sim_health_check_is_a_real_sign_on(
    acquirer_sim: Acquirer, tmp_path: Path
) -> None:
    """The deployed check passes on the running host and fails where nothing answers."""

    def check(argv: list[str]) -> int:
        workdir = empty_workdir(tmp_path)
        done = subprocess.run(argv, env=acquirer_sim.env, cwd=workdir, timeout=30, check=False)
        return done.returncode

    assert check(acquirer_sim.check) == 0
    assert acquirer_store.messages(acquirer_sim.store)[-1]["mti"] == "0800"
    deployed = [
        arg.replace(f"sign_on({acquirer_sim.port})", "sign_on(8583)") for arg in acquirer_sim.check
    ]
    assert check(_local_check(deployed, free_port())) == 1


def _local(argv: list[str], port: int) -> list[str]:
    """The deployed command line with only the bind address and port made local."""
    local = list(argv)
    local[local.index("--host") + 1] = "127.0.0.1"
    local[local.index("--port") + 1] = str(port)
    return local


def _spawn(
    argv: list[str], env: dict[str, str], tmp_path: Path, log: Path
) -> subprocess.Popen[bytes]:
    """``argv`` started in a session of its own, in an empty working folder, with ``env``
    only, its output (stderr too) written to ``log``."""
    with log.open("wb") as out:
        return subprocess.Popen(
            argv,
            env=env,
            cwd=empty_workdir(tmp_path),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


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


def _create_key(env: dict[str, str], tmp_path: Path) -> str:
    merchant = f"deploy-{uuid.uuid4().hex[:12]}"
    stdout = run_to_the_end(
        ["idempay", "admin", "create-key", "--merchant", merchant], env, tmp_path
    )
    return stdout.strip().splitlines()[-1]


@pytest.mark.parametrize(
    ("source", "acquirer_sim"), [(s, s) for s in sorted(SOURCES)], indirect=["acquirer_sim"]
)
def test_api_reaches_ready_as_deployed(
    source: str, deployed_db: str, redis_prefix: str, tmp_path: Path, acquirer_sim: Acquirer
) -> None:
    argv, env, probes = SOURCES[source]()
    assert argv == DEPLOYED
    assert env["IDEMPAY_ACQUIRER_URL"] == "iso8583://acquirer-sim:8583"
    port = free_port()
    run_env = {
        **clean_environ(),
        **image_env(),
        **env,
        **overrides(deployed_db, redis_prefix),
        "IDEMPAY_ACQUIRER_URL": acquirer_sim.url,
    }
    log = tmp_path / "server.log"
    proc = _spawn(_local(argv, port), run_env, tmp_path, log)
    try:
        base = f"http://127.0.0.1:{port}"
        ready = _wait_ready(proc, f"{base}{probes['readiness']}", log)
        body: dict[str, Any] = ready.json()
        assert body == {"status": "ok", "checks": {"database": "ok", "redis": "ok"}}
        assert httpx.get(f"{base}{probes['liveness']}", timeout=2.0).json() == {"status": "ok"}
        metrics = httpx.get(f"{base}/metrics", timeout=2.0)
        assert metrics.status_code == 200 and "idempay_requests_total" in metrics.text
        # On the acquirer-sim, never a simulated host of its own (the embedded default).
        assert f"acquirer {acquirer_sim.url}, workers 2" in log.read_text()
        created = httpx.post(
            f"{base}/v1/transactions",
            headers={
                "Authorization": f"Bearer {_create_key(run_env, tmp_path)}",
                "Idempotency-Key": str(uuid.uuid4()),
            },
            json={
                "terminal_id": "T-DEPLOY",
                "amount": 1250,
                "currency": "BRL",
                "card": {"token": "tok_visa_4242", "last4": "4242", "brand": "visa"},
            },
            timeout=30.0,
        )
        assert created.status_code == 201, created.text
        assert created.json()["status"] == "approved"
        (held,) = acquirer_store.summary(acquirer_sim.store).values()
        assert (held.requests, held.approved, held.amount) == (1, True, 1250)
    finally:
        _stop(proc)
    assert proc.returncode == 0, log.read_text()[-3000:]
