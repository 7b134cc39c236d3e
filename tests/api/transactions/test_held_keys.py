"""A create whose key another transaction holds (its uncommitted row: a stuck writer, an
operator's open transaction) is answered 409 ``request_in_progress`` (problem+json,
``Retry-After``, ``Idempotency-Status: in_progress``) with nothing written — and as many held
keys as the worker has connections never starve unrelated creates (answered 503 while
storage is up: review s7). The claim is the create's first write: what it waits on, and for
how long, decides both.

Real server (one worker, ``IDEMPAY_DB_POOL_SIZE=8``), private Postgres database."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import asyncpg
import httpx
import pytest

from api.acquirer.host.store import summary
from tests.support.backend import Backend
from tests.support.client import body

pytestmark = pytest.mark.server

HOT_CONNECTIONS = 6
WAITING = (
    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
    " AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
)


def test_held_keys_answer_409_and_never_starve_unrelated_creates(
    private_pg_backend: Backend,
) -> None:
    backend = private_pg_backend
    server = backend.server(IDEMPAY_DB_TIMEOUT="1")
    api_key = backend.api_key("held-keys")
    merchant_id = backend.sql("SELECT id FROM merchant WHERE name = 'held-keys'")[0][0]
    other_key = backend.api_key("held-keys-other")
    assert backend.database_url is not None
    dsn = backend.database_url.replace("+asyncpg", "")
    held = [str(uuid.uuid4()) for _ in range(HOT_CONNECTIONS)]

    async def run() -> tuple[list[httpx.Response], httpx.Response, float, list[httpx.Response]]:
        admin = await asyncpg.connect(dsn)
        holders = [await asyncpg.connect(dsn) for _ in held]
        txs = []
        try:
            for conn, key in zip(holders, held, strict=True):
                tx = conn.transaction()
                await tx.start()
                await conn.execute(
                    "INSERT INTO idempotency_key (merchant_id, key, state, lease_token,"
                    " created_at, updated_at) VALUES ($1, $2, 'processing', 1, now(), now())",
                    merchant_id,
                    key,
                )
                txs.append(tx)
            async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:

                def post(token: str, key: str, amount: int) -> Any:
                    return client.post(
                        "/v1/transactions",
                        json=body(amount=amount),
                        headers={"Authorization": f"Bearer {token}", "Idempotency-Key": key},
                    )

                parked = [
                    asyncio.create_task(post(api_key, key, 100 + n)) for n, key in enumerate(held)
                ]
                for _ in range(400):  # the held keys' statements wait on their holders
                    if await admin.fetchval(WAITING) >= 1:
                        break
                    await asyncio.sleep(0.01)
                else:
                    raise AssertionError("no held key's statement waits on its holder")
                started = time.monotonic()
                unrelated = await post(other_key, str(uuid.uuid4()), 999)
                waited = time.monotonic() - started
                # answered while the holders still hold: bounded waits, not command_timeout
                answers = await asyncio.wait_for(asyncio.gather(*parked), 20)
                assert await admin.fetchval(WAITING) == 0
                for tx in txs:
                    await tx.rollback()
                txs.clear()
                again = [await post(api_key, key, 100 + n) for n, key in enumerate(held)]
                return answers, unrelated, waited, again
        finally:
            for tx in txs:
                await tx.rollback()
            for conn in holders:
                await conn.close()
            await admin.close()

    answers, unrelated, waited, again = asyncio.run(run())
    assert (unrelated.status_code, waited < 2.0) == (201, True), (unrelated.text, waited)
    for answer in answers:
        assert answer.status_code == 409, answer.text
        assert answer.headers["content-type"].startswith("application/problem+json")
        assert answer.json()["code"] == "request_in_progress"
        assert answer.headers["Idempotency-Status"] == "in_progress"
        assert answer.headers.get("Retry-After") is not None
    # nothing of them was written while held: once the holders rolled back, each is processed
    assert [r.status_code for r in again] == [201] * len(held), [r.text for r in again]
    assert all(r.headers.get("Idempotent-Replayed") is None for r in again)
    written = backend.sql(
        'SELECT count(*) FROM "transaction" WHERE merchant_id = :m', m=merchant_id
    )[0][0]
    assert written == len(held)
    # a held key's 409 sent nothing: each key reached the acquirer once, with its retry
    rrns = backend.sql('SELECT rrn FROM "transaction" WHERE merchant_id = :m', m=merchant_id)
    seen = summary(backend.tmp / "var" / "acquirer.sqlite3")
    assert [seen[rrn].requests for (rrn,) in rrns] == [1] * len(held)
