"""The hot path's own asyncpg pool (``api.db.DriverPool``, issue 13 phase 3): one connection
budget with the engine, waiters served in turn or refused in time (503), a storage failure
retiring the idle connections, nothing leaked by a waiter that gives up, closed on shutdown.
Real Postgres."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest

from api.db import DriverPool, PoolClosedError, split_budget, utcnow
from api.main import build_context
from api.storage_errors import StorageUnavailableError
from api.transactions.pg_create import PgInline
from tests.support.backend import Backend
from tests.support.client import body


def test_the_budget_is_split_not_doubled() -> None:
    for budget in range(2, 100):
        engine, hot = split_budget(budget)
        assert engine >= 1 and hot >= 1
        assert engine + hot == budget
    assert split_budget(30) == (15, 15)  # the engine writes every claim and finish
    assert split_budget(1) == (1, 1)  # the documented exception: one of each


@pytest.fixture
async def pool(private_pg_backend: Backend) -> AsyncIterator[DriverPool]:
    driver_pool = DriverPool(private_pg_backend.url, 2, timeout=0.5)
    try:
        yield driver_pool
    finally:
        await driver_pool.close()


async def test_waiters_are_served_in_turn_and_refused_in_time(pool: DriverPool) -> None:
    first, second = await pool.acquire(), await pool.acquire()
    assert pool.open == 2
    waiting = asyncio.create_task(pool.acquire())
    await asyncio.sleep(0.05)
    assert not waiting.done()  # at the budget: no third connection is opened
    pool.release(first)
    assert await waiting is first  # handed over, not reopened
    with pytest.raises(TimeoutError):  # none frees up within the timeout
        await pool.acquire()
    pool.release(second)
    pool.release(first)
    assert pool.open == 2


async def test_a_waiter_that_gives_up_passes_its_connection_on(pool: DriverPool) -> None:
    first, second = await pool.acquire(), await pool.acquire()
    gives_up = asyncio.create_task(pool.acquire())
    await asyncio.sleep(0.05)
    pool.release(first)  # handed to the waiter...
    gives_up.cancel()  # ...which is cancelled before it ran again
    with pytest.raises(asyncio.CancelledError):
        await gives_up
    again = await asyncio.wait_for(pool.acquire(), 0.2)  # not leaked: idle again
    assert again is first
    pool.release(again)
    pool.release(second)
    assert pool.open == 2


async def test_an_outage_retires_the_idle_connections(pool: DriverPool) -> None:
    first, second = await pool.acquire(), await pool.acquire()
    pool.release(second)  # idle, opened before the outage
    pool.discard(first, outage=True)
    assert first.is_closed() and pool.open == 1
    fresh = await pool.acquire()
    assert fresh is not second and fresh is not first  # the idle one was not handed out
    assert second.is_closed() and pool.open == 1
    assert await fresh.fetchval("SELECT 1") == 1
    pool.release(fresh)


async def test_a_discarded_connection_frees_its_slot_for_a_waiter(pool: DriverPool) -> None:
    first, second = await pool.acquire(), await pool.acquire()
    waiting = asyncio.create_task(pool.acquire())
    await asyncio.sleep(0.05)
    pool.discard(first, outage=False)  # cut short mid-statement: closed, slot freed
    fresh = await asyncio.wait_for(waiting, 5)
    assert fresh is not first and not fresh.is_closed() and pool.open == 2
    pool.release(fresh)
    pool.release(second)


async def test_close_closes_idle_and_returned_connections(private_pg_backend: Backend) -> None:
    pool = DriverPool(private_pg_backend.url, 2, timeout=0.5)
    idle, busy = await pool.acquire(), await pool.acquire()
    pool.release(idle)
    await pool.close()
    assert idle.is_closed() and not busy.is_closed()
    pool.release(busy)  # a request finishing after the shutdown began
    assert busy.is_closed() and pool.open == 0
    with pytest.raises(PoolClosedError):
        await pool.acquire()


async def test_no_connection_in_time_is_storage_unavailable(pool: DriverPool) -> None:
    held = [await pool.acquire(), await pool.acquire()]
    with pytest.raises(StorageUnavailableError):  # answered 503, nothing acknowledged
        await PgInline(pool).read("mer_x", str(uuid.uuid4()))
    for conn in held:
        pool.release(conn)


async def test_a_worker_stays_inside_its_connection_budget(private_pg_backend: Backend) -> None:
    """Creates, replays and lookups at 20 in flight, with the request events flushing beside
    them: the worker's connections to Postgres (both pools) never exceed IDEMPAY_DB_POOL_SIZE."""
    from api.events.writer import Event, RequestOutcome
    from api.idempotency.keys import body_fingerprint
    from api.transactions import resolution
    from api.transactions.schemas import TransactionCreate

    budget = 4
    settings = private_pg_backend.settings.model_copy(update={"db_pool_size": budget})
    ctx = await build_context(settings)
    database = private_pg_backend.url.rsplit("/", 1)[1]
    seen: list[int] = []

    async def connections() -> None:
        query = (
            "SELECT count(*) FROM pg_stat_activity WHERE datname = :d AND pid <> pg_backend_pid()"
        )
        while True:
            rows = await asyncio.to_thread(private_pg_backend.sql, query, d=database)
            seen.append(int(rows[0][0]))
            await asyncio.sleep(0.02)

    async def one(n: int) -> None:
        key = str(uuid.uuid4())
        request = TransactionCreate.model_validate(body(amount=100 + n))
        digest = body_fingerprint(request)
        # 202 on a loaded machine: the acquirer's answer came after IDEMPAY_ANSWER_WITHIN
        assert (await ctx.service.create("mer_budget", key, request, digest)).status in (201, 202)
        for _ in range(200):  # until the server finished it
            if (await resolution.lookup(ctx.service, "mer_budget", key)).status == 200:
                break
            await asyncio.sleep(0.1)
        assert (await ctx.service.create("mer_budget", key, request, digest)).status == 201
        assert (await resolution.lookup(ctx.service, "mer_budget", key)).status == 200
        ctx.events.record(
            Event(utcnow(), "mer_budget", "T-1", key, "create", RequestOutcome.CREATED, 201,
                  None, None, 1.0)
        )  # fmt: skip

    watcher = asyncio.create_task(connections())
    events = asyncio.create_task(ctx.events.run_forever())
    try:
        for start in range(0, 100, 20):
            await asyncio.gather(*(one(n) for n in range(start, start + 20)))
    finally:
        watcher.cancel()
        await ctx.events.close(events)
        assert ctx.service.inline is not None
        await ctx.service.inline.close()
        await ctx.engine.dispose()
    assert seen and max(seen) <= budget, seen
