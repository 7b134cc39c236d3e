"""One merchant's receiver never holds up another's, on both backends, with receivers on
127.0.0.1 that misbehave at the socket level: an attempt ends within its deadline however
the receiver trickles its answer; a 2xx counts at its status (a body trickled after it is
not waited for); a slow but healthy receiver delays only its own queue; and a huge answer
is not read (the sender closes the connection long before the receiver has sent it)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from api.models import WebhookDelivery
from api.webhooks import endpoints
from api.webhooks.destinations import AllowList
from api.webhooks.queue import Backoff
from api.webhooks.worker import WebhookWorker
from tests.api.webhooks.outbox_events import append, merchants_engine
from tests.api.webhooks.raw_receiver import RawReceiver
from tests.support.backend import Backend
from tests.support.eventually import eventually_async
from tests.support.receiver import Receiver

SECRET = "whsec_iso"
LOOPBACK = AllowList.parse("127.0.0.0/8")  # the receivers are local: allowed explicitly
HUGE = 64 * 1024 * 1024


@pytest.fixture
async def engine(private_backend: Backend) -> AsyncIterator[AsyncEngine]:
    async with merchants_engine(private_backend, "merchant-w", "merchant-x") as engine:
        yield engine


async def _rows(engine: AsyncEngine, endpoint_id: str) -> list[Any]:
    async with engine.connect() as conn:
        query = (
            select(
                WebhookDelivery.seq,
                WebhookDelivery.attempts,
                WebhookDelivery.delivered_at,
                WebhookDelivery.last_error,
            )
            .where(WebhookDelivery.endpoint_id == endpoint_id)
            .order_by(WebhookDelivery.seq)
        )
        return list((await conn.execute(query)).all())


async def _until(probe: Callable[[], Any], until: Callable[[Any], bool], what: str) -> Any:
    return await eventually_async(probe, until=until, what=what, timeout=20)


class _Running:
    """``run_forever`` in a task, stopped and awaited on exit."""

    def __init__(self, worker: WebhookWorker) -> None:
        self.worker = worker
        self.stopping = False

    async def __aenter__(self) -> _Running:
        self.task = asyncio.create_task(
            self.worker.run_forever(interval=0.05, stop=lambda: self.stopping)
        )
        return self

    async def __aexit__(self, *_: object) -> None:
        self.stopping = True
        await asyncio.wait_for(self.task, 15)


async def test_a_trickled_answer_ends_at_the_deadline_and_holds_up_no_one(
    engine: AsyncEngine,
) -> None:
    with (
        RawReceiver("trickle_headers") as headers,
        RawReceiver("trickle_body") as body,
        Receiver(SECRET) as good,
    ):
        stuck, _ = await endpoints.add(engine, "merchant-w", headers.url, allow=LOOPBACK)
        trickling, _ = await endpoints.add(engine, "merchant-w", body.url, allow=LOOPBACK)
        other, _ = await endpoints.add(
            engine, "merchant-x", good.url, secret=SECRET, allow=LOOPBACK
        )
        await append(engine, "merchant-w", 2)
        async with httpx.AsyncClient(timeout=1.0) as client:
            worker = WebhookWorker(engine, client, allow=LOOPBACK)  # default backoff: 30 s+
            async with _Running(worker):
                await _until(
                    lambda: (headers.snapshot(), body.snapshot()),
                    until=lambda seen: seen[0]["requests"] >= 1 and seen[1]["requests"] >= 1,
                    what="both trickling receivers to have a request",
                )
                mine = await append(engine, "merchant-x", 2)  # queued while they trickle
                await _until(
                    lambda: [event["transaction_id"] for event in good.events],
                    until=lambda seen: seen == mine,
                    what="the other merchant's events at its receiver",
                )
                stuck_rows = await _until(
                    lambda: _rows(engine, stuck.id),
                    until=lambda rows: rows[0].attempts >= 1,
                    what="the attempt to the receiver trickling its headers to end",
                )
                trickled_rows = await _until(
                    lambda: _rows(engine, trickling.id),
                    until=lambda rows: all(row.delivered_at for row in rows),
                    what="both events delivered to the receiver trickling a 200's body",
                )
    assert "Timeout" in stuck_rows[0].last_error and stuck_rows[0].delivered_at is None
    assert [row.last_error for row in trickled_rows] == [None, None]
    assert body.snapshot()["cut"] == 2  # each 200's body was left unread, its connection closed
    assert await endpoints.pending(engine, other.id) == 0


async def test_a_slow_healthy_receiver_delays_only_its_own_queue(engine: AsyncEngine) -> None:
    with RawReceiver("gate") as slow, Receiver(SECRET) as good:
        held, _ = await endpoints.add(engine, "merchant-w", slow.url, allow=LOOPBACK)
        await endpoints.add(engine, "merchant-x", good.url, secret=SECRET, allow=LOOPBACK)
        await append(engine, "merchant-w", 8)
        async with httpx.AsyncClient(timeout=60) as client:  # healthy: well within it
            worker = WebhookWorker(engine, client, allow=LOOPBACK, backoff=Backoff(0.05, 0.05))
            async with _Running(worker):
                await _until(
                    slow.snapshot,
                    until=lambda seen: seen["open"] == 1,
                    what="the slow receiver to hold its first request",
                )
                mine = await append(engine, "merchant-x", 1)
                await _until(
                    lambda: [event["transaction_id"] for event in good.events],
                    until=lambda seen: seen == mine,
                    what="the other merchant's event while the slow receiver holds its first",
                )
                assert slow.snapshot()["answered"] == 0
                slow.gate.set()
                await _until(
                    lambda: endpoints.pending(engine, held.id),
                    until=lambda pending: pending == 0,
                    what="the slow receiver's 8 events, once it answers",
                )
    assert slow.snapshot()["answered"] == 8 and slow.snapshot()["connections"] >= 1


@pytest.mark.parametrize("status", [200, 500])
async def test_a_huge_answer_is_not_read(engine: AsyncEngine, status: int) -> None:
    with RawReceiver("huge", status=status, size=HUGE) as huge:
        endpoint, _ = await endpoints.add(engine, "merchant-w", huge.url, allow=LOOPBACK)
        await append(engine, "merchant-w", 1)
        async with httpx.AsyncClient(timeout=30) as client:
            worker = WebhookWorker(engine, client, allow=LOOPBACK)
            assert await worker.run_once() == 1
        seen = await _until(
            huge.snapshot,
            until=lambda seen: seen["cut"] + seen["answered"] == 1,
            what="the receiver to finish or be cut off",
        )
    rows = await _rows(engine, endpoint.id)
    assert seen["cut"] == 1 and huge.sent < HUGE  # closed long before 64 MiB was sent
    if status == 200:
        assert rows[0].delivered_at is not None and rows[0].last_error is None
    else:
        assert rows[0].delivered_at is None and rows[0].last_error.startswith("HTTP 500: xxx")
        assert len(rows[0].last_error) < 200
