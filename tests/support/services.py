"""Real services for tests: a private Postgres database per run (``idempay_tools.private_services``,
the one launcher), and idempay servers as real uvicorn processes on 127.0.0.1."""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from pathlib import Path

from idempay_tools.private_services import (
    PG_ADMIN,
    PrivateRedis,
    create_database,
    drop_database,
    pg_url,
)
from idempay_tools.serve_process import ServerProcess

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
]


class Server(ServerProcess):
    """``python -m api serve`` for a test: its own environment, port and log file."""

    def __init__(self, env: Mapping[str, str], log_path: Path, *, workers: int = 1) -> None:
        super().__init__(env, log_path, workers=workers, cwd=ROOT)


def shared_redis_prefix() -> str:
    """A key prefix private to this test run on the machine's shared Redis."""
    return f"idempay-test-{os.getpid()}-{uuid.uuid4().hex[:6]}:"


def clean_redis_prefix(url: str, prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()
