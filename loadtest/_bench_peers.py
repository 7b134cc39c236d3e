"""The bench's comparison servers (issue 13): what idempay's create is measured against.

- ``plain``: a textbook FastAPI handler — a pydantic body (the create's fields,
  ``extra="forbid"``), one Redis ``INCR``, a 201 JSON answer. No auth, no idempotency.
- ``idemkit``: the same app behind ``idemkit.IdempotencyMiddleware`` on Redis (idemkit 1.0.2,
  the dev extra): the best correct Redis-only Idempotency-Key middleware we found on PyPI —
  atomic Lua claim with a lease, fingerprint of the body, replay of the stored response,
  409 while in flight, scoped per caller (here: the Authorization header).
- ``sqlite``: idempay itself on the embedded default (``sqlite+aiosqlite``, WAL,
  ``synchronous=FULL``), with a database file of its own.

Each peer runs as ``python -m uvicorn loadtest._bench_peers:<factory> --factory`` with the
options ``idempay serve`` uses (httptools, uvloop, one worker, log level warning), in its
own process group, on a private Redis database number and key prefix.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import FastAPI, Header
from pydantic import BaseModel, ConfigDict, Field

from idempay_tools.serve_process import ServerProcess
from loadtest._bench_env import prepare_url

ROOT = Path(__file__).resolve().parents[1]
REDIS_ENV = "IDEMPAY_BENCH_PEER_REDIS_URL"
PREFIX_ENV = "IDEMPAY_BENCH_PEER_PREFIX"


class _Card(BaseModel):
    model_config = ConfigDict(extra="forbid")
    token: str = Field(min_length=1, max_length=128)
    last4: str = Field(pattern=r"^[0-9]{4}$")
    brand: str = Field(min_length=1, max_length=32)


class PlainCreate(BaseModel):
    """The create's body, validated as a textbook FastAPI app would."""

    model_config = ConfigDict(extra="forbid")
    terminal_id: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    type: Literal["purchase", "refund"] = "purchase"
    amount: int = Field(ge=1, le=10**12)
    currency: str = Field(pattern=r"^[A-Z]{3}$")
    card: _Card
    installments: int = Field(default=1, ge=1, le=24)
    metadata: dict[str, Any] | None = None


def _redis() -> Any:
    import redis.asyncio as aioredis

    return aioredis.Redis.from_url(os.environ[REDIS_ENV])


def _plain(redis: Any, prefix: str) -> FastAPI:
    app = FastAPI(title="plain")

    @app.get("/readyz")
    async def readyz() -> dict[str, str]:
        await redis.ping()
        return {"status": "ok"}

    @app.post("/v1/transactions", status_code=201)
    async def create(
        body: PlainCreate, idempotency_key: Annotated[str | None, Header()] = None
    ) -> dict[str, Any]:
        seq = await redis.incr(f"{prefix}count:{body.terminal_id}")
        return {
            "id": idempotency_key,
            "seq": seq,
            "status": "approved",
            "terminal_id": body.terminal_id,
            "type": body.type,
            "amount": body.amount,
            "currency": body.currency,
            "card": {"last4": body.card.last4, "brand": body.card.brand},
            "installments": body.installments,
        }

    return app


def plain_app() -> FastAPI:
    """uvicorn factory: the plain app (no idempotency)."""
    return _plain(_redis(), os.environ.get(PREFIX_ENV, "idempay-bench-peer:"))


def _caller(request: Any) -> str:
    """idemkit's scope: a hash of the bearer key (one namespace per API key)."""
    auth = request.headers.get("authorization") or ""
    return hashlib.sha256(auth.encode()).hexdigest()[:32]


def idemkit_app() -> Any:
    """uvicorn factory: the plain app behind idemkit's middleware on Redis."""
    from idemkit import HttpConfig, IdempotencyMiddleware
    from idemkit.backends.redis import RedisBackend

    prefix = os.environ.get(PREFIX_ENV, "idempay-bench-peer:")
    redis = _redis()
    app = _plain(redis, prefix)
    backend = RedisBackend(redis, namespace=f"{prefix}idemkit")
    config = HttpConfig(scope=_caller, scope_mode="strict", require_key_for_mutations=True)
    app.add_middleware(IdempotencyMiddleware, backend=backend, config=config)
    return app


class PeerServer(ServerProcess):
    """``uvicorn loadtest._bench_peers:<factory> --factory`` on a free loopback port."""

    def __init__(self, factory: str, log_path: Path, *, redis_url: str, prefix: str) -> None:
        super().__init__({REDIS_ENV: redis_url, PREFIX_ENV: prefix}, log_path, cwd=ROOT)
        self.factory = factory

    def command(self) -> list[str]:
        return [sys.executable, "-m", "uvicorn", f"loadtest._bench_peers:{self.factory}",
                "--factory", "--host", "127.0.0.1", "--port", str(self.port),
                "--workers", "1", "--http", "httptools", "--loop", "uvloop",
                "--log-level", "warning", "--no-access-log"]  # fmt: skip


def sqlite_url(path: Path) -> str:
    return f"sqlite+aiosqlite:///{path}"


def prepare_sqlite(path: Path) -> str:
    """Migrate a fresh SQLite database file and return an API key for the merchant ``bench``."""
    return prepare_url(sqlite_url(path))


def clean_redis(url: str, prefix: str) -> None:
    """Delete every key under ``prefix`` (the peers' private namespace) on ``url``."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        names = list(client.scan_iter(match=f"{prefix}*", count=1000))
        for start in range(0, len(names), 1000):
            client.delete(*names[start : start + 1000])
    finally:
        client.close()
