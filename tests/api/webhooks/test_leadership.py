"""Two webhook workers on Postgres: one delivers at a time (an endpoint never gets two
requests at once, nor an event twice), and when the leader's lock session dies another
leads and delivery goes on."""

from __future__ import annotations

import asyncio

import httpx

from api.auth import create_api_key
from api.db import create_engine
from api.webhooks import endpoints
from api.webhooks.destinations import AllowList
from api.webhooks.worker import LOCK_ID, WebhookWorker
from tests.api.webhooks.outbox_events import append, merchants_engine
from tests.support.backend import Backend
from tests.support.eventually import eventually_async
from tests.support.receiver import Receiver

SECRET = "whsec_lead"
LOOPBACK = AllowList.parse("127.0.0.0/8")  # the receiver is local: allowed explicitly
# this database's leader only: every webhook worker on the shared server takes the same lock id
HOLDER = (
    "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objid = :lock AND granted "
    "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
)


async def _append(backend: Backend, count: int) -> None:
    """Events for merchant-lead, written on an engine of their own (not a worker's)."""
    async with merchants_engine(backend) as engine:
        await append(engine, "merchant-lead", count)


async def _until(receiver: Receiver, count: int) -> None:
    await eventually_async(
        lambda: (len(receiver.events), list(receiver.attempts)),
        until=lambda seen: seen[0] >= count,
        what=f"{count} distinct events at the receiver (events, attempts so far)",
        timeout=20,
    )


async def test_one_worker_delivers_at_a_time_and_another_takes_over(
    private_pg_backend: Backend,
) -> None:
    backend = private_pg_backend
    engines = [create_engine(backend.settings) for _ in range(2)]
    stopping = False
    with Receiver(SECRET, delay=0.05) as receiver:
        await create_api_key(engines[0], "merchant-lead")
        await endpoints.add(
            engines[0], "merchant-lead", receiver.url, secret=SECRET, allow=LOOPBACK
        )
        async with httpx.AsyncClient(timeout=5) as client:
            tasks = [
                asyncio.create_task(
                    WebhookWorker(engine, client, allow=LOOPBACK).run_forever(
                        interval=0.02, stop=lambda: stopping
                    )
                )
                for engine in engines
            ]
            try:
                await _append(backend, 6)
                await _until(receiver, 6)
                holder = await asyncio.to_thread(backend.sql, HOLDER, lock=LOCK_ID)
                killed = await asyncio.to_thread(
                    backend.sql, "SELECT pg_terminate_backend(:pid)", pid=holder[0][0]
                )
                assert killed[0][0] is True
                await _append(backend, 3)
                await _until(receiver, 9)
            finally:
                stopping = True
                await asyncio.wait_for(asyncio.gather(*tasks), 15)
                for engine in engines:
                    await engine.dispose()
    assert receiver.max_in_flight == 1
    assert [event["seq"] for event in receiver.events] == list(range(1, 10))
    assert receiver.bad_signatures == 0
