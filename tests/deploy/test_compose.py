"""deploy/compose.yaml against the compose specification and against the app: real
subcommands, the settings each process needs, one port, health checks, start order, one
acquirer for every process, and no secret committed."""

from __future__ import annotations

import ipaddress
import re
import shutil
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest

from analytics.jobs import daily_audit
from tests.deploy.manifests import (
    DEPLOY,
    SETTINGS_ENV,
    VENV_BIN,
    MissingVariable,
    compose,
    compose_argv,
    compose_raw,
    dockerfile_stages,
    parse_idempay,
    shell_argv,
)
from tests.deploy.running import COMPOSE_ENV

ENTRYPOINT = dockerfile_stages(DEPLOY / "Dockerfile")[-1].exec_form("ENTRYPOINT")
SUBCOMMANDS = {
    "migrate": "migrate",
    "api-1": "serve",
    "api-2": "serve",
    "relay": "relay",
    "completer": "completer",
    "audit-export": "export",
    "acquirer-sim": "acquirer",
}
APP = {name for name in SUBCOMMANDS if name != "acquirer-sim"}  # idempay's own processes
# The processes that talk to the acquirer (they build the app context: api/main.py).
TALK_TO_THE_ACQUIRER = {"api-1", "api-2", "completer"}
NEEDS_REDIS = {"api-1", "api-2", "relay", "completer"}
Services = dict[str, dict[str, Any]]


@pytest.fixture(scope="module")
def services() -> Services:
    return dict(compose(COMPOSE_ENV)["services"])


def _check_jsonschema(path: Path) -> subprocess.CompletedProcess[str]:
    tool = shutil.which("check-jsonschema", path=str(VENV_BIN)) or shutil.which("check-jsonschema")
    assert tool, "check-jsonschema (dev extra) validates compose files offline"
    return subprocess.run(
        [tool, "--builtin-schema", "vendor.compose-spec", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )


def test_valid_against_the_compose_specification() -> None:
    result = _check_jsonschema(DEPLOY / "compose.yaml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_schema_check_rejects_a_broken_file(tmp_path: Path) -> None:
    broken = tmp_path / "compose.yaml"
    text = (DEPLOY / "compose.yaml").read_text()
    broken.write_text(
        text.replace("condition: service_completed_successfully", "condition: done", 1)
    )
    assert _check_jsonschema(broken).returncode != 0


def test_refuses_to_start_without_the_secrets() -> None:
    for missing in COMPOSE_ENV:
        env = {k: v for k, v in COMPOSE_ENV.items() if k != missing}
        with pytest.raises(MissingVariable, match=missing):
            compose(env)
    raw = (DEPLOY / "compose.yaml").read_text()
    for name in ("IDEMPAY_SECRET_KEY", "POSTGRES_PASSWORD"):
        for line in re.findall(rf"^\s*{name}:.*$", raw, flags=re.M):
            assert f"${{{name}:?" in line, line
    assert "${POSTGRES_PASSWORD:?" in compose_raw()["x-idempay-env"]["IDEMPAY_DATABASE_URL"]


def test_every_container_command_is_a_real_idempay_subcommand(
    services: Services, tmp_path: Path
) -> None:
    for name, subcommand in SUBCOMMANDS.items():
        argv = compose_argv(services[name], ENTRYPOINT)
        if argv[:2] == ["/bin/sh", "-c"]:
            argv = shell_argv(argv, services[name]["environment"], "idempay", tmp_path)
        assert parse_idempay(argv)[0] == subcommand, name


def test_api_replicas_serve_on_8000_without_migrating(services: Services) -> None:
    for name in ("api-1", "api-2"):
        command, params = parse_idempay(compose_argv(services[name], ENTRYPOINT))
        assert params == {
            "host": "0.0.0.0",
            "port": 8000,
            "workers": 2,
            "migrate_first": False,
            "allow_dev_secret": False,  # a real secret is supplied, never the development one
        }
        assert services[name]["expose"] == ["8000"]
        check = " ".join(services[name]["healthcheck"]["test"])
        assert "http://127.0.0.1:8000/readyz" in check


def test_each_process_gets_the_settings_it_needs(services: Services) -> None:
    secret_keys = set()
    for name in sorted(APP):
        env = services[name]["environment"]
        assert env["IDEMPAY_DATABASE_URL"].startswith("postgresql+asyncpg://idempay:"), name
        assert env["IDEMPAY_SECRET_KEY"], name
        secret_keys.add(env["IDEMPAY_SECRET_KEY"])
        if name in NEEDS_REDIS:
            assert env["IDEMPAY_REDIS_URL"] == "redis://redis:6379/0", name
        unknown = {k for k in env if k.startswith("IDEMPAY_")} - SETTINGS_ENV
        assert not unknown, f"{name}: not settings of api.config.Settings: {unknown}"
    # API and completer derive issuer keys from it: one value everywhere, or re-drives differ
    assert len(secret_keys) == 1


def test_start_order_and_health_checks(services: Services) -> None:
    assert services["migrate"]["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    assert services["migrate"]["restart"] == "no"
    for name in ("api-1", "api-2", "relay", "completer", "audit-export"):
        depends = services[name]["depends_on"]
        assert depends["migrate"] == {"condition": "service_completed_successfully"}, name
    for name in ("postgres", "redis", "api-1", "api-2", "proxy", "acquirer-sim"):
        assert services[name]["healthcheck"]["test"], name
    for name in ("migrate", "relay", "completer", "audit-export"):  # no HTTP port
        assert services[name]["healthcheck"] == {"disable": True}, name
    proxy_deps = services["proxy"]["depends_on"]
    assert proxy_deps == {n: {"condition": "service_healthy"} for n in ("api-1", "api-2")}


def test_the_proxy_balances_over_both_replicas_on_their_port(services: Services) -> None:
    conf = (DEPLOY / "nginx" / "idempay.conf").read_text()
    upstream = re.search(r"upstream idempay_api \{(.*?)\}", conf, flags=re.S)
    assert upstream
    servers = re.findall(r"^\s*server ([\w-]+):(\d+)", upstream.group(1), flags=re.M)
    assert servers == [("api-1", "8000"), ("api-2", "8000")]
    assert "proxy_pass http://idempay_api;" in conf
    listen = re.search(r"listen (\d+);", conf)
    assert listen and services["proxy"]["ports"] == [f"127.0.0.1:8080:{listen.group(1)}"]
    mount = "./nginx/idempay.conf:/etc/nginx/conf.d/default.conf:ro"
    assert mount in services["proxy"]["volumes"]


def test_named_volumes_hold_the_data(services: Services) -> None:
    volumes = compose_raw()["volumes"]
    assert set(volumes) == {"pgdata", "lake", "acquirer"}
    assert "pgdata:/var/lib/postgresql/data" in services["postgres"]["volumes"]
    assert services["acquirer-sim"]["volumes"] == ["acquirer:/data"]
    assert "lake:/lake" in services["audit-export"]["volumes"]
    assert "lake:/lake" in services["audit"]["volumes"]


def test_the_audit_exports_then_submits_the_daily_job(services: Services, tmp_path: Path) -> None:
    audit = services["audit"]
    assert audit["profiles"] == ["audit"] and services["audit-export"]["profiles"] == ["audit"]
    assert audit["depends_on"] == {"audit-export": {"condition": "service_completed_successfully"}}
    days = {(datetime.now(UTC) - timedelta(days=n)).date().isoformat() for n in (0, 1)}
    export = shell_argv(
        compose_argv(services["audit-export"], ENTRYPOINT),
        services["audit-export"]["environment"],
        "idempay",
        tmp_path,
    )
    _, params = parse_idempay(export)
    assert params["day"] in days and str(params["lake_dir"]) == "/lake"
    argv = compose_argv(audit, [])
    assert argv[:4] == ["/usr/bin/tini", "--", "/bin/sh", "-c"]
    submit = shell_argv(argv[2:], audit["environment"], "spark-submit", tmp_path)
    job = submit.index("analytics/jobs/daily_audit.py")
    assert submit[submit.index("--master") + 1] == "local[*]"
    args = daily_audit.parse_args(submit[job + 1 :])
    assert args.start == args.end and args.start.isoformat() in days
    assert args.lake == "/lake" and args.out == Path(f"/lake/audit/{args.start}")


def test_the_api_trusts_x_forwarded_for_from_the_proxy_alone(services: Services) -> None:
    """Without it every client is nginx's address; with more, any peer could pick one."""
    proxy = services["proxy"]["networks"]["default"]["ipv4_address"]
    (pool,) = compose(COMPOSE_ENV)["networks"]["default"]["ipam"]["config"]
    assert ipaddress.ip_address(proxy) in ipaddress.ip_network(pool["subnet"])
    for name in ("api-1", "api-2"):
        assert services[name]["environment"]["FORWARDED_ALLOW_IPS"] == proxy, name
    conf = (DEPLOY / "nginx" / "idempay.conf").read_text()
    assert "proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;" in conf


def _acquirer_sim(services: Services) -> dict[str, Any]:
    """The acquirer-sim's parsed `idempay acquirer` parameters."""
    command, params = parse_idempay(compose_argv(services["acquirer-sim"], ENTRYPOINT))
    assert command == "acquirer"
    return params


def test_one_acquirer_sim_for_every_process(services: Services) -> None:
    """Every process that builds the app context gets IDEMPAY_ACQUIRER_URL naming the
    acquirer-sim's service and port: without it `idempay serve` would start a simulated host
    of its own in each replica (the embedded default), each with books of its own. The
    one-shot containers carry it too, so `run --rm migrate admin key fence …` reaches it."""
    params = _acquirer_sim(services)
    assert params["host"] == "0.0.0.0" and params["port"] == 8583
    url = f"iso8583://acquirer-sim:{params['port']}"
    for name in sorted(APP):
        assert services[name]["environment"]["IDEMPAY_ACQUIRER_URL"] == url, name
    parts = urlsplit(url)
    assert parts.hostname in services and parts.port == params["port"]
    assert services["acquirer-sim"]["expose"] == [str(params["port"])]
    for name in sorted(TALK_TO_THE_ACQUIRER):
        depends = services[name]["depends_on"]
        assert depends["acquirer-sim"] == {"condition": "service_healthy"}, name


def test_the_acquirer_sim_keeps_its_store_on_its_volume(services: Services) -> None:
    store = PurePosixPath(_acquirer_sim(services)["store"])
    mounts = {m.split(":")[1]: m.split(":")[0] for m in services["acquirer-sim"]["volumes"]}
    volume = mounts.get(str(store.parent))
    assert volume in compose_raw()["volumes"], f"{store} is not on a named volume"
    # The image makes the mount point the app user's, so the new volume is writable.
    run = " ".join(dockerfile_stages(DEPLOY / "Dockerfile")[-1].all("RUN"))
    assert f"install -d -o 10001 -g 10001 /lake {store.parent}" in run
    # only one writer: never a replica count, never the API's port
    assert "deploy" not in services["acquirer-sim"]
    assert services["acquirer-sim"]["restart"] == "unless-stopped"


def test_the_acquirer_sim_gets_no_secret_and_only_settings(services: Services) -> None:
    env = services["acquirer-sim"]["environment"]
    assert not {"IDEMPAY_DATABASE_URL", "IDEMPAY_SECRET_KEY", "IDEMPAY_REDIS_URL"} & set(env)
    assert not {k for k in env if k.startswith("IDEMPAY_")} - SETTINGS_ENV


def test_the_acquirer_sim_healthcheck_is_a_sign_on_on_its_port(services: Services) -> None:
    port = _acquirer_sim(services)["port"]
    test = services["acquirer-sim"]["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python", "-c"]
    assert f"sign_on({port})" in test[3]
    assert "from api.acquirer.host.process import sign_on" in test[3]
