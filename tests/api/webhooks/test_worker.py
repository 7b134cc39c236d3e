"""The webhook worker on both backends, against receivers on 127.0.0.1: every outbox event
reaches every endpoint of its merchant, signed, in ``seq`` order, at least once; a 500, a
timeout or a refused connection is retried with backoff while later events wait, then
dead-lettered; a replay sends a time range again under the same event ids."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from api.db import utcnow
from api.webhooks import endpoints
from api.webhooks.destinations import AllowList
from api.webhooks.queue import Backoff
from api.webhooks.worker import WebhookWorker
from idempay_tools.serve_process import free_port
from tests.api.webhooks.outbox_events import append, merchants_engine
from tests.support.backend import Backend
from tests.support.eventually import eventually_async
from tests.support.receiver import Receiver

SECRET = "whsec_test"
LOOPBACK = AllowList.parse("127.0.0.0/8")  # the receivers are local: allowed explicitly
FAST = Backoff(base=0.05, cap=0.05)


@pytest.fixture
async def engine(private_backend: Backend) -> AsyncIterator[AsyncEngine]:
    async with merchants_engine(private_backend, "merchant-w", "merchant-x") as engine:
        yield engine


async def _until_settled(worker: WebhookWorker, engine: AsyncEngine, *ids: str) -> None:
    await worker.run_once()  # queues what is new

    async def pending_then_a_round() -> list[int]:
        pending = [await endpoints.pending(engine, endpoint_id) for endpoint_id in ids]
        if any(pending):
            await worker.run_once()
        return pending

    await eventually_async(
        pending_then_a_round,
        until=lambda pending: not any(pending),
        what="the deliveries to settle (pending per endpoint)",
        timeout=20,
    )


async def test_every_event_reaches_a_verifying_receiver_in_seq_order(engine: AsyncEngine) -> None:
    await append(engine, "merchant-w", 1)  # numbered before the endpoint: not sent
    with Receiver(SECRET) as receiver:
        async with httpx.AsyncClient(timeout=5) as client:
            worker = WebhookWorker(engine, client, backoff=FAST, allow=LOOPBACK)
            await worker.run_once()
            endpoint, _ = await endpoints.add(
                engine, "merchant-w", receiver.url, secret=SECRET, allow=LOOPBACK
            )
            mine = await append(engine, "merchant-w", 3)
            await append(engine, "merchant-x", 2)  # another merchant's: never sent here
            await worker.run_once()
            assert await worker.run_once() == 0
    assert receiver.bad_signatures == 0
    assert [event["transaction_id"] for event in receiver.events] == mine
    assert [event["seq"] for event in receiver.events] == [2, 3, 4]
    assert receiver.attempts == [event["event_id"] for event in receiver.events]
    assert await endpoints.pending(engine, endpoint.id) == 0


async def test_a_500_is_retried_and_later_events_wait_their_turn(engine: AsyncEngine) -> None:
    with Receiver(SECRET, fail_first=2) as receiver:
        endpoint, _ = await endpoints.add(
            engine, "merchant-w", receiver.url, secret=SECRET, allow=LOOPBACK
        )
        mine = await append(engine, "merchant-w", 3)
        async with httpx.AsyncClient(timeout=5) as client:
            worker = WebhookWorker(engine, client, backoff=FAST, allow=LOOPBACK)
            await _until_settled(worker, engine, endpoint.id)
    first, second, third = (event["event_id"] for event in receiver.events)
    assert receiver.attempts == [first, first, first, second, third]
    assert [event["transaction_id"] for event in receiver.events] == mine
    assert await endpoints.dead_letters(engine) == []


async def test_timeouts_and_refusals_end_in_the_dead_letter_list(engine: AsyncEngine) -> None:
    give_up = Backoff(base=0.05, cap=0.05, give_up_after=0.4)
    refused_url = f"http://127.0.0.1:{free_port()}/hooks"  # nothing listens there
    with Receiver(SECRET, delay=1.0) as slow, Receiver(SECRET) as good:
        timing_out, _ = await endpoints.add(
            engine, "merchant-w", slow.url, secret=SECRET, allow=LOOPBACK
        )
        refused, _ = await endpoints.add(
            engine, "merchant-w", refused_url, secret=SECRET, allow=LOOPBACK
        )
        healthy, _ = await endpoints.add(
            engine, "merchant-w", good.url, secret=SECRET, allow=LOOPBACK
        )
        mine = await append(engine, "merchant-w", 2)
        async with httpx.AsyncClient(timeout=0.3) as client:
            worker = WebhookWorker(engine, client, backoff=give_up, allow=LOOPBACK)
            await _until_settled(worker, engine, timing_out.id, refused.id, healthy.id)
            assert [event["transaction_id"] for event in good.events] == mine
            seqs = [event["seq"] for event in good.events]
            dead = await endpoints.dead_letters(engine, "merchant-w")
            assert {(row.endpoint_id, row.seq) for row in dead} == {
                (endpoint.id, seq) for endpoint in (timing_out, refused) for seq in seqs
            }
            errors = {row.endpoint_id: row.last_error or "" for row in dead}
            assert "Timeout" in errors[timing_out.id] and "Connect" in errors[refused.id]
            assert all(row.attempts >= 2 for row in dead)

            slow.delay = 0  # the receiver is fixed: replay the dead letters
            start = utcnow() - timedelta(minutes=5)
            queued = await endpoints.replay(engine, timing_out.id, start, utcnow())
            assert queued == 2
            await _until_settled(worker, engine, timing_out.id)
    assert [event["transaction_id"] for event in slow.events] == mine
    assert len(await endpoints.dead_letters(engine, "merchant-w")) == 2  # the refused ones


async def test_a_replay_sends_a_time_range_again_under_the_same_ids(engine: AsyncEngine) -> None:
    with Receiver(SECRET) as receiver:
        endpoint, _ = await endpoints.add(
            engine, "merchant-w", receiver.url, secret=SECRET, allow=LOOPBACK
        )
        before = await append(engine, "merchant-w", 2)
        start = utcnow()
        during = await append(engine, "merchant-w", 2)
        end = utcnow()
        await append(engine, "merchant-w", 1)
        async with httpx.AsyncClient(timeout=5) as client:
            worker = WebhookWorker(engine, client, backoff=FAST, allow=LOOPBACK)
            await _until_settled(worker, engine, endpoint.id)
            assert await endpoints.replay(engine, endpoint.id, start, end) == 2
            await _until_settled(worker, engine, endpoint.id)
    assert len(receiver.attempts) == 7 and len(receiver.events) == 5  # deduped by event id
    replayed = receiver.attempts[5:]
    assert replayed == [e["event_id"] for e in receiver.events if e["transaction_id"] in during]
    assert receiver.events[0]["transaction_id"] == before[0]


async def test_a_removed_endpoint_receives_nothing(engine: AsyncEngine) -> None:
    with Receiver(SECRET) as receiver:
        endpoint, _ = await endpoints.add(
            engine, "merchant-w", receiver.url, secret=SECRET, allow=LOOPBACK
        )
        await endpoints.remove(engine, endpoint.id)
        await append(engine, "merchant-w", 2)
        async with httpx.AsyncClient(timeout=5) as client:
            assert await WebhookWorker(engine, client, allow=LOOPBACK).run_once() == 0
    assert receiver.attempts == []
    assert [row.id for row in await endpoints.list_endpoints(engine, "merchant-w")] == []
