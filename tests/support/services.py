"""Real services for tests: a private Postgres database per run, and idempay servers as
real uvicorn processes on 127.0.0.1."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

import asyncpg

from idempay_tools.serve_process import ServerProcess, free_port

PG_ADMIN = os.environ.get("IDEMPAY_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
ROOT = Path(__file__).resolve().parents[2]


def pg_url(database: str, *, driver: str = "postgresql+asyncpg") -> str:
    base = PG_ADMIN.rsplit("/", 1)[0].split("://", 1)[1]
    return f"{driver}://{base}/{database}"


async def _admin(sql: str) -> None:
    conn = await asyncpg.connect(PG_ADMIN)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


def create_database(prefix: str = "idempay_t") -> str:
    name = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    asyncio.run(_admin(f'CREATE DATABASE "{name}"'))
    return name


def drop_database(name: str) -> None:
    asyncio.run(_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


class Server(ServerProcess):
    """``python -m api serve`` for a test: its own environment, port and log file."""

    def __init__(self, env: Mapping[str, str], log_path: Path, *, workers: int = 1) -> None:
        super().__init__(env, log_path, workers=workers, cwd=ROOT)


class RedisServer:
    """A private ``redis-server`` on a free port that a test may kill and restart."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)


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
