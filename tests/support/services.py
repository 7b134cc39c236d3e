"""Real services for tests: a private Postgres database per run (``idempay_tools.private_services``,
the one launcher), and idempay servers as real uvicorn processes on 127.0.0.1."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path

from idempay_tools.private_services import (
    PG_ADMIN,
    PrivateRedis,
    drop_database,
    pg_url,
)
from idempay_tools.private_services import create_database as _create_database
from idempay_tools.serve_process import ServerProcess, free_port

ROOT = Path(__file__).resolve().parents[2]
RedisServer = PrivateRedis  # a redis-server of the test's own
__all__ = [
    "PG_ADMIN",
    "ROOT",
    "RedisServer",
    "Server",
    "clean_redis_prefix",
    "create_database",
    "drop_database",
    "pg_url",
    "shared_redis_prefix",
    "worker_tag",
]


def worker_tag() -> str:
    """This pytest process's name in a parallel run (``gw0``, ``gw1``…; ``main`` alone).

    Every name a test makes on a shared service (a database on the machine's PostgreSQL, a
    key prefix on its Redis) carries it next to the process id and a random part, so the
    parallel workers of one run, and other runs on the machine, never meet."""
    return os.environ.get("PYTEST_XDIST_WORKER", "main")


def create_database(prefix: str = "idempay_t") -> str:
    """A new empty database on the shared PostgreSQL, private to this worker:
    ``<prefix>_<worker>_<pid>_<hex>``."""
    return _create_database(f"{prefix}_{worker_tag()}")


class Server(ServerProcess):
    """``python -m api serve`` for a test: its own environment, port and log file."""

    def __init__(self, env: Mapping[str, str], log_path: Path, *, workers: int = 1) -> None:
        super().__init__(env, log_path, workers=workers, cwd=ROOT)

    def start(self, *, timeout: float = 60.0) -> Server:
        """As ``ServerProcess.start``, on a new free port if the one picked was taken
        between ``free_port()`` and uvicorn's bind (another process of a parallel run)."""
        for attempt in range(3):
            try:
                return super().start(timeout=timeout)
            except RuntimeError as exc:
                if attempt == 2 or "address already in use" not in str(exc).lower():
                    raise
                self.port = free_port()
        raise AssertionError("unreachable")


SHARED_REDIS = "redis://127.0.0.1:6379/0"


def shared_redis_prefix() -> str:
    """A key prefix private to this test run on the machine's shared Redis."""
    return f"idempay-test-{worker_tag()}-{os.getpid()}-{uuid.uuid4().hex[:6]}:"


def clean_redis_prefix(url: str, prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


@contextlib.contextmanager
def shared_redis_env() -> Iterator[dict[str, str]]:
    """The server environment for the machine's shared Redis under a key prefix private to
    this test; the prefix's keys are deleted after."""
    prefix = shared_redis_prefix()
    try:
        yield {"IDEMPAY_REDIS_URL": SHARED_REDIS, "IDEMPAY_REDIS_PREFIX": prefix}
    finally:
        clean_redis_prefix(SHARED_REDIS, prefix)


def api_command(
    args: list[str], env: Mapping[str, str], *, timeout: float
) -> subprocess.CompletedProcess[str]:
    """``python -m api <args>`` from the repository in a process of its own, ``env`` on top of
    this process's environment, run to its end (bounded by ``timeout``), output captured."""
    return subprocess.run(
        [sys.executable, "-m", "api", *args],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
