"""Review s7 (Postgres group commit): SIGTERM while a batch's statement is slow (no lock
involved: here a trigger that sleeps on one key's insert — in production a commit waiting
on a synchronous standby, an I/O stall). uvicorn waits ``timeout_graceful_shutdown``
(10 s) for the requests, then cancels them: every create of the batch — the slow key's and
the unrelated creates batched with it — is answered a bare ``text/plain`` ``500 Internal
Server Error`` (no problem+json, no ``code``, no ``Idempotency-Status``, no
``Retry-After``), and the batch, which the cancellation does not touch (it runs in the
writer task; ``GroupCommit.close`` lets it finish), commits a few seconds later during the
shutdown: each of those creates is written after its terminal was told 500, with no request
event for it.

Contract §2: every error is RFC 9457 problem+json with a machine-readable ``code``; every
response to create carries ``Idempotency-Status``. (A retry of the 500 gets the replay:
"after any 5xx a retry with the same key is safe and gets the real outcome" holds.) Unlike
test_sigterm_while_alone this does not depend on a lock wait, so a bound on lock waits does
not remove it; with group commit it takes every create co-batched with the slow one along
(this test with ``IDEMPAY_PG_GROUP_COMMIT=false``, d3dafde: the three unrelated creates
answered 201 at once, only the slow one a bare 500).
Seen on d3dafde: the four answered a bare 500 12.2 s after they were sent (SIGTERM + 10 s),
all four transactions written, no request event for any of the four keys.

Passes since session 7: 7 s after SIGTERM (3 s before uvicorn's grace ends) the creates whose
statement still runs are answered in flight by the app (``GroupCommit.answer_in_flight``:
409 ``request_in_progress``, problem+json, ``Retry-After``); the statement may still commit,
which the terminal's lookup then shows.

Real server (one worker), private Postgres database with its own stalling trigger. Two
blocker keys (a 2 s stall each) park the two writers so that the slow key and three others
queue up and are taken as one batch.
"""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from typing import Any

import asyncpg
import httpx
import pytest

from tests.support.backend import Backend
from tests.support.client import body

pytestmark = pytest.mark.server

STALL = """
CREATE TABLE review_s7_stall (key varchar(36) PRIMARY KEY, seconds float NOT NULL);
CREATE FUNCTION review_s7_stall() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_sleep(s.seconds) FROM review_s7_stall AS s WHERE s.key = NEW.key;
  RETURN NEW;
END $$;
CREATE TRIGGER review_s7_stall BEFORE INSERT ON idempotency_key
  FOR EACH ROW EXECUTE FUNCTION review_s7_stall();
"""
SLEEPING = (
    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
    " AND wait_event = 'PgSleep'"
)


def test_creates_of_a_slow_batch_at_sigterm_are_answered_per_contract(
    private_pg_backend: Backend,
) -> None:
    backend = private_pg_backend
    assert backend.database_url is not None
    dsn = backend.database_url.replace("+asyncpg", "")
    blockers = [str(uuid.uuid4()), str(uuid.uuid4())]
    slow = str(uuid.uuid4())
    others = [str(uuid.uuid4()) for _ in range(3)]

    async def setup() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(STALL)
            await conn.executemany(
                "INSERT INTO review_s7_stall VALUES ($1, $2)",
                [(blockers[0], 2.0), (blockers[1], 2.0), (slow, 14.0)],
            )
        finally:
            await conn.close()

    asyncio.run(setup())
    server = backend.server()
    api_key = backend.api_key("review-s7-stall")

    async def run() -> list[httpx.Response]:
        admin = await asyncpg.connect(dsn)
        try:
            async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:

                def post(key: str, amount: int) -> Any:
                    return asyncio.ensure_future(
                        client.post(
                            "/v1/transactions",
                            json=body(amount=amount),
                            headers={"Authorization": f"Bearer {api_key}", "Idempotency-Key": key},
                        )
                    )

                async def sleeping(n: int) -> None:
                    for _ in range(400):
                        if await admin.fetchval(SLEEPING) >= n:
                            return
                        await asyncio.sleep(0.01)
                    raise AssertionError(f"fewer than {n} statements stall")

                parked = [post(blockers[0], 1)]
                await sleeping(1)
                parked.append(post(blockers[1], 2))
                await sleeping(2)
                batch = [post(slow, 3), *(post(key, 10 + n) for n, key in enumerate(others))]
                assert [r.status_code for r in await asyncio.gather(*parked)] == [201, 201]
                await sleeping(1)  # the batch of the four, stalled on the slow key's insert
                os.killpg(server.pid, signal.SIGTERM)
                return list(await asyncio.gather(*batch))
        finally:
            await admin.close()

    answers = asyncio.run(run())
    assert server.proc is not None
    server.proc.wait(30)
    for answer in answers:
        assert answer.status_code in (409, 503), (answer.status_code, answer.text)
        assert answer.headers["content-type"].startswith("application/problem+json")
        assert answer.headers.get("Idempotency-Status") is not None
