"""The relay's leadership is a Postgres session lock: when the session holding it dies (a
database restart drops every connection), the relay must notice and take the lock again
before it publishes — found by the chaos harness's PostgreSQL restart (before, the relay
kept publishing with no lock, so a standby relay could lead at the same time)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import defaultdict
from datetime import UTC, datetime

import redis.asyncio as aioredis
from prometheus_client import REGISTRY
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from api.db import create_engine
from api.outbox.relay import LOCK_ID, STREAM_MAXLEN, Relay
from tests.api.redis.conftest import SHARED_REDIS
from tests.support.backend import Backend
from tests.support.eventually import eventually_async

HOLDER = (
    "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objid = :lock "
    "AND granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
)


async def _holder(backend: Backend) -> int | None:
    rows = await asyncio.to_thread(backend.sql, HOLDER, lock=LOCK_ID)
    return int(rows[0][0]) if rows else None


async def _wait_holder(backend: Backend, *, other_than: int | None) -> int:
    pid = await eventually_async(
        lambda: _holder(backend),
        until=lambda pid: pid is not None and pid != other_than,
        what=f"a relay holding the leadership lock (a session other than {other_than})",
        timeout=20,
    )
    assert pid is not None
    return pid


async def test_a_relay_whose_lock_session_dies_leads_again(pg_backend: Backend) -> None:
    engine = create_engine(pg_backend.settings)
    stopping = False
    relay = Relay(engine, None, stream="unused")  # no events here: Redis is never called
    task = asyncio.create_task(relay.run_forever(interval=0.05, stop=lambda: stopping))
    try:
        first = await _wait_holder(pg_backend, other_than=None)
        killed = await asyncio.to_thread(
            pg_backend.sql, "SELECT pg_terminate_backend(:pid)", pid=first
        )
        assert killed[0][0] is True
        second = await _wait_holder(pg_backend, other_than=first)
        assert second != first
        assert not task.done()  # it survived losing its session
    finally:
        stopping = True
        await asyncio.wait_for(task, 10)
        await engine.dispose()


# --------------------------------------------------------------- numbering, issue 22 item 5
WAITING_ON_A_LOCK = (
    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
    "AND wait_event_type = 'Lock'"
)


def _outbox_rows(backend: Backend, merchant: str, count: int) -> None:
    now = datetime.now(UTC)
    statement = (
        "INSERT INTO outbox_event (event_id, merchant_id, type, transaction_id, payload, "
        "created_at) VALUES (:e, :m, 'transaction.completed', :t, :p, :at)"
    )
    for _ in range(count):
        event_id, key = str(uuid.uuid4()), str(uuid.uuid4())
        payload = json.dumps({"event_id": event_id, "merchant_id": merchant, "type": "x"})
        backend.sql(statement, e=event_id, m=merchant, t=key, p=payload, at=now)
    backend.sql("INSERT INTO merchant_outbox_seq (merchant_id, seq) VALUES (:m, 0)", m=merchant)


async def _waiting(backend: Backend) -> int:
    return int((await asyncio.to_thread(backend.sql, WAITING_ON_A_LOCK))[0][0])


async def test_two_relay_ticks_at_once_number_each_event_once(
    private_pg_backend: Backend, shared_redis: dict[str, str]
) -> None:
    """Relay A's numbering transaction is held up (a test transaction holds the merchant's
    counter row); relay B ticks meanwhile — a standby that took over, or a manual
    ``relay --once``. Before, B numbered the same rows again after A: 20 events published
    under two numbers each and a counter at 40. Now B's tick does not lead (A's
    transaction holds the lock), and could not claim A's rows anyway (SKIP LOCKED)."""
    merchant = f"mer_{uuid.uuid4().hex[:12]}"
    await asyncio.to_thread(_outbox_rows, private_pg_backend, merchant, 20)
    stream = f"{shared_redis['IDEMPAY_REDIS_PREFIX']}outbox"
    client = aioredis.Redis.from_url(SHARED_REDIS)
    engine = create_engine(private_pg_backend.settings)
    holder = create_async_engine(private_pg_backend.url, poolclass=NullPool)
    relay_a = Relay(engine, client, stream=stream, batch=100)
    relay_b = Relay(engine, client, stream=stream, batch=100)
    try:
        async with holder.connect() as conn:
            await conn.execute(text("BEGIN"))
            await conn.execute(
                text("SELECT seq FROM merchant_outbox_seq WHERE merchant_id = :m FOR UPDATE"),
                {"m": merchant},
            )
            tick_a = asyncio.create_task(relay_a.run_once())
            await eventually_async(
                lambda: _waiting(private_pg_backend),
                until=lambda waiting: waiting >= 1,
                what="relay A waiting on the merchant's counter row",
                timeout=20,
            )
            tick_b = asyncio.create_task(relay_b.run_once())

            async def b_state() -> tuple[bool, int]:
                return tick_b.done(), await _waiting(private_pg_backend)

            await eventually_async(
                b_state,
                until=lambda state: state[0] or state[1] >= 2,
                what="relay B to end its tick or wait on a lock (done, sessions waiting)",
                timeout=20,
            )
            await conn.execute(text("COMMIT"))
        await asyncio.wait_for(asyncio.gather(tick_a, tick_b), 30)
        while await relay_a.run_once():
            pass
        entries = await client.xrange(stream)
    finally:
        await client.aclose()
        await engine.dispose()
        await holder.dispose()

    published: dict[str, set[int]] = defaultdict(set)
    for _id, fields in entries:
        published[fields[b"event_id"].decode()].add(json.loads(fields[b"payload"])["seq"])
    assert len(published) == 20
    assert all(len(seqs) == 1 for seqs in published.values()), published
    assert sorted(s for seqs in published.values() for s in seqs) == list(range(1, 21))
    counter = await asyncio.to_thread(
        private_pg_backend.sql,
        "SELECT seq FROM merchant_outbox_seq WHERE merchant_id = :m",
        m=merchant,
    )
    assert counter[0][0] == 20


async def test_the_relay_measures_the_stream_against_its_retention_bound(
    private_pg_backend: Backend, shared_redis: dict[str, str]
) -> None:
    merchant = f"mer_{uuid.uuid4().hex[:12]}"
    await asyncio.to_thread(_outbox_rows, private_pg_backend, merchant, 5)
    stream = f"{shared_redis['IDEMPAY_REDIS_PREFIX']}outbox"
    client = aioredis.Redis.from_url(SHARED_REDIS)
    engine = create_engine(private_pg_backend.settings)
    try:
        await client.xadd(stream, {"event_id": "older", "payload": "{}"}, id="1000-0")
        assert await Relay(engine, client, stream=stream, batch=100).run_once() == 5
        length = await client.xlen(stream)
    finally:
        await client.aclose()
        await engine.dispose()
    assert REGISTRY.get_sample_value("idempay_outbox_stream_entries") == length == 6
    assert REGISTRY.get_sample_value("idempay_outbox_stream_maxlen") == STREAM_MAXLEN
    oldest_age = REGISTRY.get_sample_value("idempay_outbox_stream_oldest_age_seconds")
    assert oldest_age is not None
    assert oldest_age > 1_000_000_000  # the entry stamped 1970-01-01T00:00:01: decades old
