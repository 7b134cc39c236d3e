"""A later attempt's refusal never hides a processed payment (contract §2.2: a key that
exists is never guarded). Postgres, one-write path: attempt a (``allow_duplicate``) holds the
guard's lock while it waits on the key's row; attempt b of the SAME key, sent after it, waits
on the lock; when a commits, b's statement snapshot (taken before its wait) does not show the
key, and b answered 409 ``suspected_duplicate`` — "nothing was stored or charged" for a
charged payment (hostile review, session 5). Now b answers from the key: the replay."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from api.config import Settings
from api.transactions.pg_group import LOCK_WAIT
from tests.api.guard.conftest import Merchant, new_key
from tests.api.guard.test_guard import OVERRIDE
from tests.support.client import body

pytestmark = pytest.mark.parametrize("guard_settings", ["postgres"], indirect=True)


async def test_a_later_attempt_of_a_key_committed_under_it_replays(
    guarded: Merchant, guard_settings: Settings
) -> None:
    payload = body(amount=4711, terminal_id="T-LATER")
    first = await guarded.create(new_key(), payload)
    assert first.status_code == 201, first.text
    key = new_key()
    merchant = await guarded.merchant_id()
    dsn = guard_settings.database_url.replace("postgresql+asyncpg://", "postgresql://")
    blocker = await asyncpg.connect(dsn)
    # the attempts wait on the blocker longer than a create's own lock wait (500 ms, then 409
    # ``request_in_progress``): this test is about what they answer once it is gone
    inline = guarded.app.state.ctx.service.inline
    inline.lock_wait = "10s"
    try:
        holding = blocker.transaction()
        await holding.start()  # an uncommitted row of the key: attempt a parks on it
        await blocker.execute(
            "INSERT INTO idempotency_key (merchant_id, key, state, lease_token, created_at,"
            " updated_at) VALUES ($1, $2, 'processing', 1, now(), now())",
            merchant,
            key,
        )
        attempt_a = asyncio.ensure_future(guarded.create(key, {**payload, **OVERRIDE}))
        await asyncio.sleep(0.7)  # a holds the guard's lock, waiting on the row
        attempt_b = asyncio.ensure_future(guarded.create(key, payload))
        await asyncio.sleep(0.7)  # b waits on the lock
        await holding.rollback()
        a, b = await attempt_a, await attempt_b
    finally:
        inline.lock_wait = LOCK_WAIT
        await blocker.close()
    assert a.status_code == 201, a.text
    assert b.status_code == 201, b.text  # before: 409 suspected_duplicate
    assert b.headers["idempotent-replayed"] == "true"
    assert b.content == a.content
