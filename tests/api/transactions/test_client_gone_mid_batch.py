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

import httpx
import pytest

from tests.api.transactions.truthful_answers import new_merchant
from tests.support.backend import Backend
from tests.support.client import body
from tests.support.stalls import WAITING, admin, dsn, held_key, until_seen

pytestmark = pytest.mark.server


def test_create_of_a_client_gone_mid_batch_is_processed_once(
    private_pg_backend: Backend,
) -> None:
    backend = private_pg_backend
    server = backend.server()
    api_key, merchant_id = new_merchant(backend, "review-s7-gone")
    held = str(uuid.uuid4())
    headers = {"Authorization": f"Bearer {api_key}", "Idempotency-Key": held}

    async def run() -> tuple[list[tuple[str, int]], httpx.Response]:
        async with admin(backend) as watch:
            async with held_key(dsn(backend), merchant_id, held):
                async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
                    gone = asyncio.ensure_future(
                        client.post("/v1/transactions", json=body(amount=55), headers=headers)
                    )
                    await until_seen(  # its batch waits on the holder
                        watch, WAITING, what="the create's batch waiting on the holder", within=10
                    )
                    gone.cancel()  # the terminal hangs up: its connection is closed
                    with pytest.raises(asyncio.CancelledError):
                        await gone
                await asyncio.sleep(1.0)  # past the batch's lock wait
            events: list[tuple[str, int]] = []
            for _ in range(200):  # the gone request is answered, and its event flushed
                rows = await watch.fetch(
                    "SELECT outcome, http_status FROM request_event WHERE idempotency_key = $1",
                    held,
                )
                events = [(row[0], row[1]) for row in rows]
                if events:
                    break
                await asyncio.sleep(0.05)
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
