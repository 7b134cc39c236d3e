"""Review s7 (Postgres group commit): a terminal that hangs up while its create waits
(its batch gave up on another transaction's lock of the key, and the create waits alone).

Held: the create is still processed, once, and its request event is recorded (uvicorn
does not cancel a request whose client went away; the create is answered into the void);
the terminal's retry with the same key gets the replay (contract §2, §3.1).
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

    async def run() -> httpx.Response:
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
            async with httpx.AsyncClient(base_url=server.url, timeout=1.5) as client:
                with pytest.raises(httpx.ReadTimeout):  # the terminal hangs up
                    await client.post("/v1/transactions", json=body(amount=55), headers=headers)
            assert await admin.fetchval(WAITING) >= 1  # its create still waits alone
        finally:
            await tx.rollback()
            await holder.close()
        try:
            for _ in range(100):  # written once the holder is gone, and its event flushed
                events = await admin.fetch(
                    "SELECT outcome, http_status FROM request_event WHERE idempotency_key = $1",
                    held,
                )
                if events:
                    break
                await asyncio.sleep(0.05)
            assert [tuple(e) for e in events] == [("created", 201)]
        finally:
            await admin.close()
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
            return await client.post("/v1/transactions", json=body(amount=55), headers=headers)

    retry = asyncio.run(run())
    assert retry.status_code == 201 and retry.headers.get("Idempotent-Replayed") == "true"
    assert backend.sql('SELECT count(*) FROM "transaction" WHERE id = :k', k=held) == [(1,)]
    assert backend.sql("SELECT count(*) FROM ledger_entry WHERE transaction_id = :k", k=held) == [
        (1,)
    ]
