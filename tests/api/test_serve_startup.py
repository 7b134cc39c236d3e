"""`idempay serve`'s start (contract §6): one start-up line — a JSON record of the server's
log, like every line on its stdout — naming the URL, the database without its password,
Redis (or none), the acquirer (the child it started, or the one it was given) and the
workers; and a refusal to bind anything but loopback while `IDEMPAY_SECRET_KEY` is the
published development default, unless `--allow-dev-secret` says so."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import make_url

from api.cli import (
    DEV_SECRET_KEY,
    is_loopback,
    refuse_dev_secret,
    startup_line,
    without_password,
)
from api.config import Settings
from idempay_tools.serve_process import ServerProcess
from tests.support.backend import FAST_ENV, Backend
from tests.support.services import ROOT, SHARED_REDIS, shared_redis_env

OWN_SECRET = "s" * 48


def _records(log: Path) -> list[dict[str, Any]]:
    """Every line the server wrote, each one JSON record (fails on any other line)."""
    records = []
    for line in log.read_text().splitlines():
        record = json.loads(line)
        assert isinstance(record, dict) and {"event", "level", "timestamp"} <= record.keys()
        records.append(record)
    return records


def _started(
    env: dict[str, str], log: Path, *args: str, workers: int = 1
) -> tuple[ServerProcess, dict[str, Any]]:
    """A server started with ``args`` and stopped again, and its start-up record: said once
    (by serve, not by each worker), before any record of the running app. Only warnings
    about the database (Postgres settings) may come before it."""
    server = ServerProcess({**FAST_ENV, **env}, log, workers=workers, args=args, cwd=ROOT)
    try:
        server.start()
    finally:
        server.stop()
    records = _records(log)
    at = [i for i, record in enumerate(records) if record["event"].startswith("idempay serving")]
    assert len(at) == 1, records
    assert {record["event"] for record in records[: at[0]]} <= {"postgres_setting"}, records
    return server, records[at[0]]


@pytest.fixture
def redis_env() -> Iterator[dict[str, str]]:
    with shared_redis_env() as env:
        yield env


def test_loopback_is_told_from_other_binds() -> None:
    for host in ("127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost", "LOCALHOST"):
        assert is_loopback(host), host
    for host in ("0.0.0.0", "::", "10.0.0.5", "192.168.1.20", "example.com", ""):
        assert not is_loopback(host), host


def test_passwords_are_left_out_of_urls() -> None:
    cases = {
        "postgresql+asyncpg://app:hunter2@db.internal:5432/idempay": (
            "postgresql+asyncpg://app@db.internal:5432/idempay"
        ),
        "redis://:hunter2@cache:6379/0": "redis://cache:6379/0",
        "rediss://default:hunter2@[::1]:6380/1": "rediss://default@[::1]:6380/1",
        "postgresql+asyncpg://postgres@127.0.0.1:5432/test": (
            "postgresql+asyncpg://postgres@127.0.0.1:5432/test"
        ),
        "sqlite+aiosqlite:///var/idempay.db": "sqlite+aiosqlite:///var/idempay.db",
        "sqlite+aiosqlite:////tmp/x/idempay.db": "sqlite+aiosqlite:////tmp/x/idempay.db",
    }
    for url, shown in cases.items():
        assert without_password(url) == shown, url


def test_the_line_names_a_given_acquirer_and_a_redis_without_its_password() -> None:
    settings = Settings(
        database_url="postgresql+asyncpg://app:hunter2@db:5432/idempay",
        redis_url="redis://:hunter2@cache:6379/0",
        secret_key=OWN_SECRET,
    )
    message, fields = startup_line(
        settings, host="0.0.0.0", port=8000, workers=2, acquirer="iso8583://acquirer:8583"
    )
    assert "hunter2" not in message and "hunter2" not in json.dumps(fields)
    assert fields == {
        "url": "http://0.0.0.0:8000",
        "database": "postgresql+asyncpg://app@db:5432/idempay",
        "redis": "redis://cache:6379/0",
        "acquirer": "iso8583://acquirer:8583",
        "workers": 2,
        "secret_key": "set",
    }
    for value in ("http://0.0.0.0:8000", "iso8583://acquirer:8583", "workers 2"):
        assert value in message
    assert "development default" not in message


def test_the_development_secret_is_refused_only_off_loopback() -> None:
    dev = Settings(secret_key=DEV_SECRET_KEY)
    own = Settings(secret_key=OWN_SECRET)
    assert refuse_dev_secret("127.0.0.1", dev, allowed=False) is None
    assert refuse_dev_secret("0.0.0.0", own, allowed=False) is None
    assert refuse_dev_secret("0.0.0.0", dev, allowed=True) is None
    refusal = refuse_dev_secret("0.0.0.0", dev, allowed=False)
    assert refusal is not None
    assert "IDEMPAY_SECRET_KEY" in refusal and "--allow-dev-secret" in refusal


def test_serve_refuses_a_public_bind_with_the_development_secret(tmp_path: Path) -> None:
    """Refused before anything starts: exit 2, the reason on stderr, stdout left to the
    log (empty), no database made, no acquirer started."""
    var = tmp_path / "var"
    env = {
        "PATH": "/usr/bin:/bin",
        "IDEMPAY_VAR_DIR": str(var),
        "IDEMPAY_SECRET_KEY": DEV_SECRET_KEY,
    }
    done = subprocess.run(
        [sys.executable, "-m", "api", "serve", "--host", "0.0.0.0", "--port", "8000"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stdout == ""
    assert "refusing to bind 0.0.0.0" in done.stderr
    assert "IDEMPAY_SECRET_KEY" in done.stderr and "--allow-dev-secret" in done.stderr
    assert not var.exists()


def test_the_start_up_line_names_what_the_server_uses(
    pg_backend: Backend, redis_env: dict[str, str], tmp_path: Path
) -> None:
    """On Postgres (its URL carrying a password the shared server's trust auth ignores) with
    Redis: the first record names the URL, the database without the password, Redis, the
    child acquirer and the workers, and warns of the development secret; every line of
    stdout is a JSON record. Two workers: the line is still said once."""
    database = make_url(pg_backend.url).set(password="pw-not-for-logs")
    env = {
        **redis_env,
        "IDEMPAY_VAR_DIR": str(tmp_path / "var"),
        "IDEMPAY_DATABASE_URL": database.render_as_string(hide_password=False),
        "IDEMPAY_SECRET_KEY": DEV_SECRET_KEY,
    }
    log = tmp_path / "serve.log"
    server, first = _started(env, log, workers=2)
    assert "pw-not-for-logs" not in log.read_text()
    assert first["url"] == server.url
    assert first["database"] == pg_backend.url  # the same URL, without the password
    assert first["redis"] == SHARED_REDIS
    assert first["acquirer"].startswith("iso8583://127.0.0.1:")
    assert first["acquirer"].endswith("(simulated host, a child process)")
    assert first["workers"] == 2
    assert first["secret_key"] == "development default" and first["level"] == "warning"
    for value in (server.url, first["database"], SHARED_REDIS, first["acquirer"], "workers 2"):
        assert value in first["event"], value
    assert "IDEMPAY_SECRET_KEY is the development default" in first["event"]


@pytest.mark.parametrize(
    ("secret", "flags", "level", "said"),
    [
        (DEV_SECRET_KEY, ("--allow-dev-secret",), "warning", "development default"),
        (OWN_SECRET, (), "info", "set"),
    ],
    ids=["dev-secret-allowed", "own-secret"],
)
def test_a_public_bind_starts_when_allowed_or_with_a_secret_of_its_own(
    private_sqlite_backend: Backend,
    tmp_path: Path,
    secret: str,
    flags: tuple[str, ...],
    level: str,
    said: str,
) -> None:
    """0.0.0.0 (which includes loopback, where the test reaches it) with the flag, or with
    a secret key of its own; on the embedded SQLite, no Redis, the child acquirer."""
    env = {**private_sqlite_backend.env, "IDEMPAY_SECRET_KEY": secret}
    server, first = _started(env, tmp_path / "serve.log", "--host", "0.0.0.0", *flags)
    assert first["url"] == f"http://0.0.0.0:{server.port}"
    assert first["database"] == private_sqlite_backend.url
    assert first["redis"] == "none"
    assert first["acquirer"].endswith("(simulated host, a child process)")
    assert (first["secret_key"], first["level"]) == (said, level)
