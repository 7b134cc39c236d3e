"""A relay leader that stops (SIGSTOP) keeps nothing past its lease: two ``idempay relay``
processes on a private Postgres database and a private Redis prefix, the leading one stopped;
the standby leads and publishes the events appended meanwhile. Continued, the old leader
finds its lock gone and stands by; the stream holds every event, in order, under one
``seq`` each (at least once: consumers dedupe by ``event_id``).

Stopped wherever it happens to be, the leader is most often between ticks, its lock session
idle, which ``idle_session_timeout`` ends. Stopped inside a transaction of its lock session
(each tick's check and numbering), that session is "idle in transaction", which that timeout
never ends. Stopped between a statement's parse and its execution, the session is
"active", waiting for the client, which no timeout of Postgres ends: the last test holds a
relay-named session in that state, holding the relay's lock, deterministically."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from api.auth import create_api_key
from api.db import create_engine
from api.outbox.relay import LOCK_ID, consume
from tests.api.redis.conftest import SHARED_REDIS
from tests.api.webhooks.outbox_events import append
from tests.support.backend import Backend
from tests.support.eventually import eventually_async
from tests.support.leaders import api_process, stop_process, stop_while, stuck_session
from tests.support.stalls import dsn

LEASE = 2  # IDEMPAY_RELAY_LEASE: seconds a stopped leader keeps what it holds
# each wait (a relay's start; the lease, the standby's 1 s poll for the lock and a tick)
# many times over, as the webhook worker's test does for load. A standby that never gets
# to publish fails it whatever the margin.
WAIT = 15 * LEASE
TAG = "idempay-relay"  # application_name prefix of a relay's sessions in a transaction
# the session of this database holding the relay's lock, and whether it is in a transaction
LEADER = (
    "SELECT l.pid, a.xact_start IS NOT NULL FROM pg_locks l JOIN pg_stat_activity a"
    " ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.objid = :lock AND l.granted"
    " AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
)
MERCHANT = "merchant-relay-stuck"


def _relay(env: dict[str, str], log: Path) -> AbstractContextManager[subprocess.Popen[bytes]]:
    return api_process(
        ["relay"], {**env, "IDEMPAY_RELAY_LEASE": str(LEASE), "IDEMPAY_LOG_JSON": "false"}, log
    )


async def _anywhere(engine: AsyncEngine, pid: int) -> None:
    stop_process(pid)


async def _inside_a_transaction(engine: AsyncEngine, pid: int) -> None:
    """Stop the leader while its lock session is inside a transaction (each tick opens two
    of a few ms: the lock check, then the numbering)."""
    async with engine.connect() as conn:

        async def in_transaction() -> bool:
            row = (await conn.execute(text(LEADER), {"lock": LOCK_ID})).first()
            await conn.commit()
            return bool(row and row[1])

        await stop_while(pid, in_transaction, what="the leader inside a transaction", within=WAIT)


async def _stream_events(client: Any, stream: str) -> list[dict[str, Any]]:
    return consume(await client.xrange(stream), set())  # deduped by event_id


async def _all_marked_sent(engine: AsyncEngine) -> None:
    async def unsent() -> int:
        async with engine.connect() as conn:
            query = text("SELECT count(*) FROM outbox_event WHERE sent_at IS NULL")
            return int((await conn.execute(query)).scalar_one())

    await eventually_async(
        unsent, until=lambda n: n == 0, what="every event marked sent", timeout=WAIT
    )


@pytest.mark.parametrize("stop", [_anywhere, _inside_a_transaction], ids=lambda f: f.__name__[1:])
async def test_a_stopped_relay_leader_loses_the_lead_to_a_standby(
    private_pg_backend: Backend,
    shared_redis: dict[str, str],
    tmp_path: Path,
    stop: Callable[[AsyncEngine, int], Awaitable[None]],
) -> None:
    backend = private_pg_backend
    env = {**backend.env, **shared_redis}
    stream = f"{shared_redis['IDEMPAY_REDIS_PREFIX']}outbox"
    engine = create_engine(backend.settings)
    client = aioredis.Redis.from_url(SHARED_REDIS)
    try:
        await create_api_key(engine, MERCHANT)

        async def published(count: int, what: str) -> None:
            await eventually_async(
                lambda: _stream_events(client, stream),
                until=lambda seen: len(seen) >= count,
                what=what,
                timeout=WAIT,
            )

        first = await append(engine, MERCHANT, 2)
        with _relay(env, tmp_path / "a.log") as leader:
            await published(2, "the leader to publish the first events")
            with _relay(env, tmp_path / "b.log"):
                await stop(engine, leader.pid)
                later = await append(engine, MERCHANT, 2)
                await published(4, "the standby to lead and publish while the leader is stopped")
                os.kill(leader.pid, signal.SIGCONT)
                more = await append(engine, MERCHANT, 2)
                await published(6, "the relays to publish after the leader continued")
                await _all_marked_sent(engine)
        events = await _stream_events(client, stream)
    finally:
        await client.aclose()
        await engine.dispose()
    logs = "\n".join((tmp_path / name).read_text() for name in ("a.log", "b.log"))
    assert [event["transaction_id"] for event in events] == first + later + more, logs
    assert [event["seq"] for event in events] == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("lock", ["pg_advisory_lock", "pg_advisory_xact_lock"])
async def test_a_relay_stuck_mid_statement_loses_the_lock_to_the_next(
    private_pg_backend: Backend, shared_redis: dict[str, str], tmp_path: Path, lock: str
) -> None:
    """A relay stopped after asyncpg parsed a new statement and before it ran it (a new
    statement on a session is prepared first, then bound) leaves its session "active",
    waiting for the rest, whatever ``idle_in_transaction_session_timeout`` says. Here such a
    session of another relay holds the relay's lock inside a transaction — a leader's lock
    session mid-tick (``pg_advisory_lock``), a ``relay --once`` or a webhook worker's
    numbering (``pg_advisory_xact_lock``): the relay that runs ends it once older than the
    lease, then leads and publishes."""
    backend = private_pg_backend
    env = {**backend.env, **shared_redis}
    stream = f"{shared_redis['IDEMPAY_REDIS_PREFIX']}outbox"
    engine = create_engine(backend.settings)
    client = aioredis.Redis.from_url(SHARED_REDIS)
    stuck = await stuck_session(
        dsn(backend),
        f"{TAG} stopped",
        f"SELECT {lock}($1)",
        LOCK_ID,
    )
    try:
        await create_api_key(engine, MERCHANT)
        sent = await append(engine, MERCHANT, 2)
        with _relay(env, tmp_path / "a.log"):
            await eventually_async(
                lambda: _stream_events(client, stream),
                until=lambda seen: len(seen) >= 2,
                what="the relay to end the stuck session, lead and publish",
                timeout=WAIT,
            )
        events = await _stream_events(client, stream)
        log = (tmp_path / "a.log").read_text()
    finally:
        stuck.terminate()
        await client.aclose()
        await engine.dispose()
    assert [event["transaction_id"] for event in events] == sent, log
    assert [event["seq"] for event in events] == [1, 2]
    assert "relay_stale_session_ended" in log
