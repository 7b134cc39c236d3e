"""Review s7 (Postgres group commit): held edge, plain test. A terminal aborts its key while
the key's create sits, inserted but uncommitted, in a batch parked on another key's holder
(an abort's fence insert would wait on that insert); the batch gives up on its lock wait
(500 ms) and rolls back, the abort fences the key, and the create's re-send (alone) finds
the fence: the
abort answers 200 ``aborted``, the create 410 ``transaction_aborted``, and nothing is ever
written under the key (contract §2, abort: "if nothing was processed under the key, the key
is fenced and any later create with it gets 410 and is never processed").

One server (one worker), private Postgres database. The holder is a plain transaction with
uncommitted rows of three keys: two park the worker's two writers (so the held key and the
aborted key queue up and are taken as one batch), the third parks that batch.
"""

from __future__ import annotations

import asyncio
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


async def _waiting(admin: Any, n: int, extra: str = "") -> None:
    for _ in range(400):
        if await admin.fetchval(WAITING + extra) >= n:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"fewer than {n} statements wait on the holder")


def test_abort_while_the_create_is_in_a_batch_that_falls_back(
    private_pg_backend: Backend,
) -> None:
    backend = private_pg_backend
    server = backend.server()
    api_key = backend.api_key("review-s7-abort")
    merchant_id = backend.sql("SELECT id FROM merchant WHERE name = 'review-s7-abort'")[0][0]
    assert backend.database_url is not None
    dsn = backend.database_url.replace("+asyncpg", "")
    blockers = [str(uuid.uuid4()), str(uuid.uuid4())]
    held, victim = str(uuid.uuid4()), str(uuid.uuid4())

    async def run() -> tuple[httpx.Response, httpx.Response, list[int]]:
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
            async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
                headers = {"Authorization": f"Bearer {api_key}"}

                def post(key: str, amount: int) -> Any:
                    return asyncio.ensure_future(
                        client.post(
                            "/v1/transactions",
                            json=body(amount=amount),
                            headers={**headers, "Idempotency-Key": key},
                        )
                    )

                parked = [post(blockers[0], 3)]
                await _waiting(admin, 1)
                parked.append(post(blockers[1], 4))
                await _waiting(admin, 2)
                parked.append(post(held, 5))  # queued behind them with the victim: one batch
                create = post(victim, 6)
                for _ in range(400):  # the blockers wait alone, the batch of the two waits
                    alone = await admin.fetchval(WAITING + " AND query NOT ILIKE '%unnest%'")
                    batch = await admin.fetchval(WAITING + " AND query ILIKE '%unnest%'")
                    if (alone, batch) == (2, 1):
                        break
                    await asyncio.sleep(0.01)
                else:
                    raise AssertionError("the batch of the held key and the victim does not wait")
                abort = await client.post(f"/v1/transactions/{victim}/abort", headers=headers)
                answer = await create
                await tx.rollback()
                rolled_back = True
                return abort, answer, [r.status_code for r in await asyncio.gather(*parked)]
        finally:
            if not rolled_back:
                await tx.rollback()
            await holder.close()
            await admin.close()

    abort, answer, held_answers = asyncio.run(run())
    assert abort.status_code == 200 and abort.json()["status"] == "aborted", abort.text
    assert answer.status_code == 410, answer.text
    assert answer.json()["code"] == "transaction_aborted"
    assert answer.headers.get("Idempotency-Status") == "aborted"
    assert set(held_answers) <= {201, 409}, held_answers  # written after the holder, or 409
    assert backend.sql('SELECT count(*) FROM "transaction" WHERE id = :k', k=victim) == [(0,)]
    assert backend.sql("SELECT state FROM idempotency_key WHERE key = :k", k=victim) == [
        ("aborted",)
    ]
