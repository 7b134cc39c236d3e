"""Review gc (dea15b0, Postgres group commit): a key whose insert waits on another
transaction's lock parks its whole batch, and with the default 2 writers two such keys park
every create of the process: an unrelated create (another key, nothing locked) is not
answered until the other transactions end — up to the connection's ``command_timeout``
(30 s), after which its whole batch is answered 503 though storage was never down.

Before dea15b0 (and with ``IDEMPAY_PG_GROUP_COMMIT=false``, the control below) each create
is its own statement: the unrelated create is answered 201 at once.

Real server, private Postgres database; the lock holders are plain transactions holding an
uncommitted row of the key (what a batch also waits on: any other writer of the same
(merchant, key) — another worker's batch, a general-path claim/finish, an abort's fence,
the purge — for as long as it stays open).

Failed on dea15b0; passes since def0de0 (kept to guard the fix).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import asyncpg
import httpx
import pytest

from tests.support.backend import Backend
from tests.support.client import body

pytestmark = pytest.mark.server

WAITING = (
    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
    " AND wait_event_type = 'Lock' AND query ILIKE '%unnest%'"
)
WAITING_ANY = (
    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
    " AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
)


async def _parked(admin: Any, n: int, query: str) -> None:
    for _ in range(300):
        if await admin.fetchval(query) >= n:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"fewer than {n} statements wait on the held keys")


def _unrelated_create_waits(backend: Backend, group_commit: bool) -> float:
    server = backend.server(IDEMPAY_PG_GROUP_COMMIT="true" if group_commit else "false")
    api_key = backend.api_key("review-gc-hol")
    merchant_id = backend.sql("SELECT id FROM merchant WHERE name = 'review-gc-hol'")[0][0]
    assert backend.database_url is not None
    dsn = backend.database_url.replace("+asyncpg", "")
    held = [str(uuid.uuid4()), str(uuid.uuid4())]

    async def run() -> float:
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

                def post(key: str, amount: int) -> Any:
                    return client.post(
                        "/v1/transactions",
                        json=body(amount=amount),
                        headers={"Authorization": f"Bearer {api_key}", "Idempotency-Key": key},
                    )

                # one create per held key, each parked in a statement of its own
                first = asyncio.create_task(post(held[0], 101))
                await _parked(admin, 1, WAITING_ANY)
                second = asyncio.create_task(post(held[1], 102))
                await _parked(admin, 2, WAITING_ANY)
                # an unrelated create: another key, nothing holds it
                started = time.monotonic()
                unrelated = asyncio.create_task(post(str(uuid.uuid4()), 103))
                done, _ = await asyncio.wait({unrelated}, timeout=5)
                waited = time.monotonic() - started
                status = unrelated.result().status_code if done else None
                for tx in txs:
                    await tx.rollback()
                txs.clear()
                answers = await asyncio.gather(first, second, unrelated)
                assert [a.status_code for a in answers] == [201, 201, 201]
                assert status == 201 or status is None
                return waited
        finally:
            for tx in txs:
                await tx.rollback()
            for conn in holders:
                await conn.close()
            await admin.close()

    return asyncio.run(run())


def test_an_unrelated_create_is_not_parked_behind_locked_keys(
    private_pg_backend: Backend,
) -> None:
    assert _unrelated_create_waits(private_pg_backend, group_commit=True) < 2.0


def test_control_without_group_commit_the_unrelated_create_answers_at_once(
    private_pg_backend: Backend,
) -> None:
    assert _unrelated_create_waits(private_pg_backend, group_commit=False) < 2.0
