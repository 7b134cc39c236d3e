"""Review finding C on Postgres, without timing: a transaction row written by a database
transaction that is still open (an older xid) holds back every row committed after it, so a
walk can never pass it; and a transaction open in *another* database does not hold the
listing back. Plain Postgres only (SQLite serializes its writers)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from tests.api.conftest import Deployment
from tests.support.client import Api, body, new_key

_INSERT = (
    'INSERT INTO "transaction" (merchant_id, id, terminal_id, type, amount, currency,'
    " card_last4, card_brand, card_fingerprint, installments, status, created_at,"
    " processed_at) VALUES ($1, $2, $3, 'purchase', 100, 'BRL', '4242', 'visa', 'fp', 1,"
    " 'approved', now(), now())"
)


def _list(api: Api, **params: Any) -> dict[str, Any]:
    with api.client() as client:
        response = client.get("/v1/transactions", params=params, headers=api.headers(None, None))
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


def _dsn(url: str) -> str:
    return url.replace("postgresql+asyncpg://", "postgresql://")


# Postgres's snapshot rule only (SQLite serializes its writers): the suite's backend
# parameter narrowed to Postgres, rather than a skipped SQLite half.
pytestmark = pytest.mark.parametrize("backend", ["postgres"], indirect=True)


@pytest.fixture
def pg(deployment: Deployment) -> Iterator[Deployment]:
    assert deployment.backend.name == "postgres"
    yield deployment


async def _merchant_of(deployment: Deployment, conn: asyncpg.Connection) -> str:
    key = new_key()
    assert deployment.a.create(key, body(terminal_id="T-WHO")).status_code == 201
    return str(await conn.fetchval('SELECT merchant_id FROM "transaction" WHERE id = $1', key))


async def test_a_row_of_an_open_transaction_holds_back_the_rows_committed_after_it(
    pg: Deployment,
) -> None:
    terminal = f"T-X{uuid.uuid4().hex[:8]}"
    since = (datetime.now(UTC) - timedelta(seconds=5)).isoformat()
    params = {"since": since, "terminal_id": terminal, "limit": 1}
    slow_id = str(uuid.uuid4())
    held = await asyncpg.connect(_dsn(pg.backend.url))
    try:
        merchant = await _merchant_of(pg, held)
        open_ = held.transaction()
        await open_.start()
        await held.execute(_INSERT, merchant, slow_id, terminal)  # an older xid, uncommitted
        later = [new_key() for _ in range(2)]
        for key in later:
            assert pg.a.create(key, body(terminal_id=terminal)).status_code == 201
        before = _list(pg.a, **params)
        # before the fix the walk was already past the open row here, for good
        assert before["data"] == [] and before["next_cursor"] is None, before
        await open_.commit()
    finally:
        await held.close()
    walk, cursor = [], None
    while True:
        page = _list(pg.a, **params, **({"cursor": cursor} if cursor else {}))
        walk += [row["id"] for row in page["data"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert walk == [slow_id, *later]


async def test_a_transaction_open_in_another_database_does_not_hold_the_listing_back(
    pg: Deployment,
) -> None:
    terminal = f"T-O{uuid.uuid4().hex[:8]}"
    since = (datetime.now(UTC) - timedelta(seconds=5)).isoformat()
    other = _dsn(pg.backend.url).rsplit("/", 1)[0] + "/postgres"
    elsewhere = await asyncpg.connect(other)
    try:
        open_ = elsewhere.transaction()
        await open_.start()
        await elsewhere.execute("SELECT pg_current_xact_id()")  # holds an xid, in 'postgres'
        key = new_key()
        assert pg.a.create(key, body(terminal_id=terminal)).status_code == 201
        page = _list(pg.a, since=since, terminal_id=terminal)
        assert [row["id"] for row in page["data"]] == [key]
        await open_.rollback()
    finally:
        await elsewhere.close()
