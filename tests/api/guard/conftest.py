"""The duplicate guard's fixtures: the real app (``create_app``: lifespan, lean create route,
the hot path's key reads, completer, advice worker, event writer) in process over
``httpx.ASGITransport``, on each backend — an embedded SQLite file, and a private Postgres
database — with the simulated acquirer host the app spawns as its child (its store in the
app's var dir). Each test makes its own merchant and sets its guard before the merchant's
first request (the setting comes with the API key, cached a minute per process)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import text

from api.acquirer.host import store as acquirer_store
from api.auth import create_api_key
from api.config import Settings
from api.migrate import migrate
from api.transactions.guard import set_window
from tests.support import asgi
from tests.support.asgi import UNLIMITED
from tests.support.client import body
from tests.support.eventually import eventually_async
from tests.support.services import create_database, drop_database, pg_url

TRANSACTIONS = "/v1/transactions"


def new_key() -> str:
    return str(uuid.uuid4())


class Merchant:
    """One merchant's API key, its id, and the requests of contract §2 made with it."""

    def __init__(self, app: FastAPI, http: httpx.AsyncClient, api_key: str, name: str) -> None:
        self.app = app
        self.http = http
        self.api_key = api_key
        self.name = name

    def headers(self, key: str | None = None) -> dict[str, str]:
        headers = {"Authorization": f"Bearer {self.api_key}"}
        if key is not None:
            headers["Idempotency-Key"] = key
        return headers

    async def create(self, key: str, payload: dict[str, Any] | None = None) -> httpx.Response:
        return await self.http.post(
            TRANSACTIONS, json=body() if payload is None else payload, headers=self.headers(key)
        )

    async def lookup(self, key: str) -> httpx.Response:
        return await self.http.get(f"{TRANSACTIONS}/{key}", headers=self.headers())

    async def reverse(self, key: str) -> httpx.Response:
        return await self.http.post(f"{TRANSACTIONS}/{key}/reversal", headers=self.headers())

    async def sql(self, statement: str, **params: Any) -> list[Any]:
        engine = self.app.state.ctx.engine
        async with engine.begin() as conn:
            result = await conn.execute(text(statement), params)
            return list(result.fetchall()) if result.returns_rows else []

    async def merchant_id(self) -> str:
        rows = await self.sql("SELECT id FROM merchant WHERE name = :n", n=self.name)
        return str(rows[0][0])

    async def transaction(self, key: str) -> Any:
        rows = await self.sql(
            'SELECT status, duplicate_override, metadata FROM "transaction" WHERE id = :k',
            k=key,
        )
        return rows[0] if rows else None

    async def stored(self, key: str) -> dict[str, int]:
        """What exists under ``key``: key row, transaction, ledger entries, outbox events,
        reversal advices, and 0200s the acquirer received for the key's RRN (the app's child
        host: its store in the app's var dir)."""
        counts = {}
        for name, statement in {
            "key": "SELECT count(*) FROM idempotency_key WHERE key = :k",
            "transaction": 'SELECT count(*) FROM "transaction" WHERE id = :k',
            "ledger": "SELECT count(*) FROM ledger_entry WHERE transaction_id = :k",
            "outbox": "SELECT count(*) FROM outbox_event WHERE transaction_id = :k",
            "advice": "SELECT count(*) FROM acquirer_advice WHERE key = :k",
        }.items():
            rows = await self.sql(statement, k=key)
            counts[name] = int(rows[0][0])
        rrn = self.app.state.ctx.service.rrn(await self.merchant_id(), key)
        at_acquirer = acquirer_store.summary(self.acquirer_store()).get(rrn)
        counts["acquirer"] = 0 if at_acquirer is None else at_acquirer.requests
        return counts

    def acquirer_store(self) -> Path:
        return Path(self.app.state.ctx.settings.var_dir) / "acquirer.sqlite3"

    async def create_events(self, key: str, count: int = 1) -> list[tuple[str, int]]:
        """(outcome, http_status) of the key's create request events, once ``count`` of
        them are written (the event writer flushes in batches)."""

        async def probe() -> list[tuple[str, int]]:
            rows = await self.sql(
                "SELECT outcome, http_status FROM request_event"
                " WHERE idempotency_key = :k AND endpoint = 'create' ORDER BY ts",
                k=key,
            )
            return [(str(outcome), int(status)) for outcome, status in rows]

        return await eventually_async(
            probe,
            what=f"{count} create events of {key}",
            until=lambda rows: len(rows) >= count,
            timeout=10,
        )


@pytest.fixture(
    scope="module",
    params=["sqlite", pytest.param("postgres", marks=pytest.mark.server)],
)
def guard_settings(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Settings]:
    var: Path = tmp_path_factory.mktemp(f"guard-{request.param}") / "var"
    name = create_database("idempay_guard") if request.param == "postgres" else None
    settings = Settings(
        database_url=pg_url(name) if name else None,
        var_dir=var,
        redis_url=None,
        acquirer_slow_seconds=0.2,
        answer_within=1.0,
        acquirer_timeout=2.0,  # a claim's lease: 2 + 1 s
        lease_seconds=1.0,
        completer_interval=0.2,
        event_flush_interval=0.05,
        **UNLIMITED,
        db_pool_size=8,
    )
    migrate(settings)  # runs its own event loops: before the app's
    try:
        yield settings
    finally:
        if name:
            drop_database(name)


app, http = asgi.app, asgi.http  # the fixtures, on asgi_settings


@pytest.fixture(scope="module")
def asgi_settings(guard_settings: Settings) -> Settings:
    """The settings of tests.support.asgi's ``app`` fixture."""
    return guard_settings


async def new_merchant(app: FastAPI, http: httpx.AsyncClient, window: int | None) -> Merchant:
    """A merchant of the test's own, its guard set (None: off) before its first request."""
    engine = app.state.ctx.engine
    name = f"guard-{uuid.uuid4().hex[:10]}"
    api_key = await create_api_key(engine, name)
    await set_window(engine, name, window)
    return Merchant(app, http, api_key, name)


@pytest.fixture
async def guarded(app: FastAPI, http: httpx.AsyncClient) -> Merchant:
    return await new_merchant(app, http, 120)


@pytest.fixture
async def unguarded(app: FastAPI, http: httpx.AsyncClient) -> Merchant:
    return await new_merchant(app, http, None)
