"""Review s7 (Postgres group commit): a terminal that hangs up while its create sits in a
batch parked on another transaction's lock of the key.

Held: the create is answered all the same (uvicorn does not cancel a request whose client
went away; the answer goes into the void) and its request event is recorded; it is
processed at most once, and the terminal's retry with the same key, once the holder is
gone, gets the real outcome — the replay when the gone request wrote the key (its event
``created``), else the create processed now (contract §2, §3.1: one transaction).
"""

from __future__ import annotations

import asyncio
import uuid

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


def test_create_of_a_client_gone_mid_batch_is_processed_once(
    private_pg_backend: Backend,
) -> None:
    backend = private_pg_backend
    server = backend.server()
    api_key = backend.api_key("review-s7-gone")
    merchant_id = backend.sql("SELECT id FROM merchant WHERE name = 'review-s7-gone'")[0][0]
    assert backend.database_url is not None
    dsn = backend.database_url.replace("+asyncpg", "")
    held = str(uuid.uuid4())
    headers = {"Authorization": f"Bearer {api_key}", "Idempotency-Key": held}

    async def run() -> tuple[list[tuple[str, int]], httpx.Response]:
        admin = await asyncpg.connect(dsn)
        holder = await asyncpg.connect(dsn)
        tx = holder.transaction()
        await tx.start()
        try:
            await holder.execute(
                "INSERT INTO idempotency_key (merchant_id, key, state, lease_token,"
                " created_at, updated_at) VALUES ($1, $2, 'processing', 1, now(), now())",
                merchant_id,
                held,
            )
            async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
                gone = asyncio.ensure_future(
                    client.post("/v1/transactions", json=body(amount=55), headers=headers)
                )
                for _ in range(300):  # its batch waits on the holder
                    if await admin.fetchval(WAITING) >= 1:
                        break
                    await asyncio.sleep(0.01)
                else:
                    raise AssertionError("the create's batch does not wait on the holder")
                gone.cancel()  # the terminal hangs up: its connection is closed
                with pytest.raises(asyncio.CancelledError):
                    await gone
            await asyncio.sleep(1.0)  # past the batch's lock wait
        finally:
            await tx.rollback()
            await holder.close()
        try:
            events: list[tuple[str, int]] = []
            for _ in range(200):  # the gone request is answered, and its event flushed
                rows = await admin.fetch(
                    "SELECT outcome, http_status FROM request_event WHERE idempotency_key = $1",
                    held,
                )
                events = [(row[0], row[1]) for row in rows]
                if events:
                    break
                await asyncio.sleep(0.05)
        finally:
            await admin.close()
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
            retry = await client.post("/v1/transactions", json=body(amount=55), headers=headers)
        return events, retry

    events, retry = asyncio.run(run())
    assert len(events) == 1, events
    assert retry.status_code == 201, retry.text
    if events == [("created", 201)]:  # the gone request wrote it: the retry replays it
        assert retry.headers.get("Idempotent-Replayed") == "true"
    else:  # it was answered without writing (e.g. 409 in progress): the retry writes it
        assert events[0][1] in (409, 503), events
        assert retry.headers.get("Idempotency-Status") == "created"
    assert backend.sql('SELECT count(*) FROM "transaction" WHERE id = :k', k=held) == [(1,)]
    assert backend.sql("SELECT count(*) FROM ledger_entry WHERE transaction_id = :k", k=held) == [
        (1,)
    ]
