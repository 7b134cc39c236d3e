"""The bench's comparison servers: what idempay's create is measured against.

- ``plain``: a textbook FastAPI handler — a pydantic body (the create's fields,
  ``extra="forbid"``), one Redis ``INCR``, one 0200 to the bench's acquirer host through the
  link library idempay uses (``api.acquirer.link.AcquirerLink``, the same number of
  connections, the same timeout), a 201 JSON answer with the acquirer's verdict. No auth,
  no idempotency, no database.
- ``idemkit``: the same app behind ``idemkit.IdempotencyMiddleware`` on Redis (idemkit 1.0.2,
  the dev extra): the best correct Redis-only Idempotency-Key middleware we found on PyPI —
  atomic Lua claim with a lease, fingerprint of the body, replay of the stored response,
  409 while in flight, scoped per caller (here: the Authorization header).
- ``sqlite``: idempay itself on the embedded default (``sqlite+aiosqlite``, WAL,
  ``synchronous=FULL``), with a database file of its own.

Each peer runs as ``python -m uvicorn loadtest._bench_peers:<factory> --factory`` with the
options ``idempay serve`` uses (httptools, uvloop, one worker, log level warning), in its
own process group, on a private Redis database number and key prefix, pointed at the
acquirer host by ``IDEMPAY_BENCH_PEER_ACQUIRER_URL``. Each 0200's RRN is
``rrn_for(secret, merchant, Idempotency-Key)``, as idempay derives it, under a merchant id of
the peer's own (``bench-plain``): no RRN of a peer meets one of idempay's at the host.
"""

from __future__ import annotations

import hashlib
import os
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import FastAPI, Header
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from api.acquirer.link import AcquirerLink
from api.acquirer.messages import rrn_for
from api.acquirer.types import AcquirerError, AuthorizationRequest
from api.config import Settings
from idempay_tools.serve_process import ServerProcess
from loadtest._bench_env import prepare_url

ROOT = Path(__file__).resolve().parents[1]
REDIS_ENV = "IDEMPAY_BENCH_PEER_REDIS_URL"
PREFIX_ENV = "IDEMPAY_BENCH_PEER_PREFIX"
ACQUIRER_ENV = "IDEMPAY_BENCH_PEER_ACQUIRER_URL"
MERCHANT = "bench-plain"
_DEFAULTS = Settings.model_fields  # the link's connections and timeout: idempay's defaults
CONNECTIONS = int(_DEFAULTS["acquirer_connections"].default)
TIMEOUT_S = float(_DEFAULTS["acquirer_timeout"].default)
SECRET = str(_DEFAULTS["secret_key"].default).encode()


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
    link = AcquirerLink(os.environ[ACQUIRER_ENV], connections=CONNECTIONS)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        await link.start()
        try:
            yield
        finally:
            await link.close()

    app = FastAPI(title="plain", lifespan=lifespan)

    @app.get("/readyz")
    async def readyz() -> dict[str, str]:
        await redis.ping()
        return {"status": "ok" if link.state == "up" else link.state}

    @app.post("/v1/transactions", status_code=201, response_model=None)
    async def create(
        body: PlainCreate, idempotency_key: Annotated[str | None, Header()] = None
    ) -> dict[str, Any] | JSONResponse:
        key = idempotency_key or str(uuid.uuid4())
        seq = await redis.incr(f"{prefix}count:{body.terminal_id}")
        request = AuthorizationRequest(
            rrn=rrn_for(SECRET, MERCHANT, key),
            merchant_id=MERCHANT,
            terminal_id=body.terminal_id,
            card_token=body.card.token,
            amount=body.amount,
            currency=body.currency,
            type=body.type,
            captured_at=None,
        )
        try:
            auth = await link.authorize(request, timeout_s=TIMEOUT_S)
        except AcquirerError as exc:  # never sent or in doubt: no verdict to give
            return JSONResponse({"error": type(exc).__name__}, status_code=503)
        return {
            "id": key,
            "seq": seq,
            "status": "approved" if auth.approved else "declined",
            "decline_reason": auth.decline_reason,
            "authorization_code": auth.authorization_code,
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

    def __init__(
        self, factory: str, log_path: Path, *, redis_url: str, prefix: str, acquirer_url: str
    ) -> None:
        env = {REDIS_ENV: redis_url, PREFIX_ENV: prefix, ACQUIRER_ENV: acquirer_url}
        super().__init__(env, log_path, cwd=ROOT)
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
