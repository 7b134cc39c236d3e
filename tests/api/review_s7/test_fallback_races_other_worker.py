"""Review s7 (Postgres group commit): held edge, plain test. A batch that gives up on another
transaction's lock (500 ms) and is rolled back, while the same key waits in another worker's
batch behind the first batch's uncommitted insert of it: the other worker writes it, the
first one's re-send (alone) finds it — one transaction, exactly one caller answered 201
``created`` and the other the replay of the identical body (contract §2, §3.2); the creates
batched with them are answered in about a second; the held keys are written once their
holder is gone, or answered 409 (in progress), never 5xx.

Two servers (one worker each) on one private Postgres database, so each request's worker is
known. The holder is a plain transaction with uncommitted rows of three keys: two park
worker one's two writers (so the held key and the shared key queue up and are taken as one
batch), the third parks that batch with the shared key's insert in it.
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
    " AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
)


async def _waiting(admin: Any, n: int) -> None:
    for _ in range(400):
        if await admin.fetchval(WAITING) >= n:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"fewer than {n} statements wait on the holder")


def test_rolled_back_batch_and_the_other_workers_batch_share_a_key(
    private_pg_backend: Backend,
) -> None:
    backend = private_pg_backend
    one, two = backend.server(), backend.server()
    api_key = backend.api_key("review-s7-race")
    merchant_id = backend.sql("SELECT id FROM merchant WHERE name = 'review-s7-race'")[0][0]
    assert backend.database_url is not None
    dsn = backend.database_url.replace("+asyncpg", "")
    blockers = [str(uuid.uuid4()), str(uuid.uuid4())]
    held, shared = str(uuid.uuid4()), str(uuid.uuid4())

    async def run() -> tuple[list[httpx.Response], list[httpx.Response], float, list[int]]:
        admin = await asyncpg.connect(dsn)
        holder = await asyncpg.connect(dsn)
        tx = holder.transaction()
        await tx.start()
        rolled_back = False
        try:
            for key in (*blockers, held):
                await holder.execute(
                    "INSERT INTO idempotency_key (merchant_id, key, state, lease_token,"
                    " created_at, updated_at) VALUES ($1, $2, 'processing', 1, now(), now())",
                    merchant_id,
                    key,
                )
            async with (
                httpx.AsyncClient(base_url=one.url, timeout=60) as c1,
                httpx.AsyncClient(base_url=two.url, timeout=60) as c2,
            ):

                def post(client: httpx.AsyncClient, key: str, amount: int) -> Any:
                    return asyncio.ensure_future(
                        client.post(
                            "/v1/transactions",
                            json=body(amount=amount),
                            headers={
                                "Authorization": f"Bearer {api_key}",
                                "Idempotency-Key": key,
                            },
                        )
                    )

                parked = [post(c1, blockers[0], 3)]  # worker one's writers, one each
                await _waiting(admin, 1)
                parked.append(post(c1, blockers[1], 4))
                await _waiting(admin, 2)
                parked.append(post(c1, held, 5))  # queued behind them: one batch
                first = post(c1, shared, 6)
                for _ in range(400):  # the blockers wait alone, the batch with both waits
                    alone = await admin.fetchval(WAITING + " AND query NOT ILIKE '%unnest%'")
                    batch = await admin.fetchval(WAITING + " AND query ILIKE '%unnest%'")
                    if (alone, batch) == (2, 1):
                        break
                    await asyncio.sleep(0.01)
                else:
                    raise AssertionError("worker one's batch of the two keys does not wait")
                visible = "SELECT count(*) FROM idempotency_key WHERE key = $1"
                assert await admin.fetchval(visible, shared) == 0  # inserted, not committed
                started = time.monotonic()
                # worker two: the shared key, waiting on worker one's insert of it, and a
                # fresh key in the same batch
                second = [post(c2, shared, 6), post(c2, str(uuid.uuid4()), 7)]
                answered = await asyncio.gather(first, *second)
                waited = time.monotonic() - started
                await tx.rollback()
                rolled_back = True
                held_answers = [r.status_code for r in await asyncio.gather(*parked)]
                return [answered[0], answered[1]], [answered[2]], waited, held_answers
        finally:
            if not rolled_back:
                await tx.rollback()
            await holder.close()
            await admin.close()

    (on_one, on_two), fresh, waited, held_answers = asyncio.run(run())
    assert waited < 2.0, waited
    # worker one's batch rolled back: worker two wrote the key, worker one's re-send replays
    assert on_two.headers.get("Idempotency-Status") == "created", on_two.text
    assert on_one.headers.get("Idempotency-Status") == "replayed", on_one.text
    assert on_one.status_code == on_two.status_code == 201
    assert on_one.headers.get("Idempotent-Replayed") == "true"
    assert on_one.content == on_two.content
    assert [r.status_code for r in fresh] == [201]
    assert set(held_answers) <= {201, 409}, held_answers  # written after the holder, or 409
    assert backend.sql('SELECT count(*) FROM "transaction" WHERE id = :k', k=shared) == [(1,)]
