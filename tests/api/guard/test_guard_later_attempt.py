"""A later attempt's refusal never hides a processed payment (contract §2.2: a key that
exists is never guarded). Postgres, the claim's transaction: attempt a (``allow_duplicate``)
holds the guard's advisory lock while its claim waits on the key's row (another transaction's
uncommitted insert); attempt b of the SAME key, sent after it, waits on the lock. When the
row's holder rolls back, a claims the key and sends its 0200; b's probe still finds the earlier
sale, but its claim finds a's key — and b answers from the key (in flight, then, waiting with
``Prefer: wait``, a's replay), never 409 ``suspected_duplicate`` ("nothing was stored or
charged") for a key that is charged."""

from __future__ import annotations

import asyncio

import asyncpg
import httpx
import pytest

from api.config import Settings
from tests.api.guard.conftest import TRANSACTIONS, Merchant, new_key
from tests.api.guard.test_guard import OVERRIDE
from tests.support.client import body
from tests.support.eventually import eventually_async

pytestmark = pytest.mark.parametrize("guard_settings", ["postgres"], indirect=True)


async def _waiting(blocker: asyncpg.Connection, event: str, count: int) -> None:
    """Until ``count`` backends of this database wait on a lock of kind ``event``
    (``transactionid``: a row another transaction inserted; ``advisory``: the guard's)."""

    async def waiting() -> int:
        return int(
            await blocker.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock' AND wait_event = $1",
                event,
            )
        )

    def reached(n: int) -> bool:
        return n == count

    await eventually_async(waiting, what=f"{count} waiting on {event}", until=reached, timeout=30)


async def test_a_later_attempt_of_a_key_committed_under_it_replays(
    guarded: Merchant, guard_settings: Settings
) -> None:
    payload = body(amount=4711, terminal_id="T-LATER")
    first = await guarded.create(new_key(), payload)
    assert first.status_code == 201, first.text
    key = new_key()
    merchant = await guarded.merchant_id()
    assert guard_settings.database_url is not None
    dsn = guard_settings.database_url.replace("postgresql+asyncpg://", "postgresql://")
    blocker = await asyncpg.connect(dsn)
    try:
        holding = blocker.transaction()
        await holding.start()  # an uncommitted row of the key: attempt a parks on it
        await blocker.execute(
            "INSERT INTO idempotency_key (merchant_id, key, state, lease_token, created_at,"
            " updated_at) VALUES ($1, $2, 'processing', 1, now(), now())",
            merchant,
            key,
        )
        watcher = await asyncpg.connect(dsn)
        try:
            attempt_a = asyncio.ensure_future(guarded.create(key, {**payload, **OVERRIDE}))
            await _waiting(watcher, "transactionid", 1)  # a holds the guard's lock
            attempt_b = asyncio.ensure_future(
                guarded.http.post(
                    TRANSACTIONS,
                    json=payload,
                    headers={**guarded.headers(key), "Prefer": "wait=20"},
                )
            )
            await _waiting(watcher, "advisory", 1)  # b waits on the guard's lock
        finally:
            await watcher.close()
        await holding.rollback()
        a, b = await attempt_a, await attempt_b
    finally:
        await blocker.close()
    assert a.status_code == 201, a.text
    assert a.json()["status"] == "approved"
    assert bool((await guarded.transaction(key))[1])  # a's override was recorded
    assert isinstance(b, httpx.Response)
    assert b.status_code == 201, b.text  # not 409 suspected_duplicate
    assert b.headers["idempotent-replayed"] == "true"
    assert b.content == a.content
    assert (await guarded.stored(key))["acquirer"] == 1  # one 0200 for the key
