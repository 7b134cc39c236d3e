"""A leader that stops confirming its lock loses it to the database: two ``idempay
webhooks`` processes on Postgres, the leading one stopped (SIGSTOP, its lock session left
open and idle); past the lease Postgres ends that session, the standby leads and the events
queued meanwhile are delivered. Continued, the old leader finds its lock gone and stands by.

Stopped wherever it happens to be, the leader is most often between ticks; stopped inside
a tick's transaction (the numbering's, which holds the relay's transaction lock), that
session is "idle in transaction", which ``idle_session_timeout`` never ends: the standby
led but could number nothing. The ``inside_numbering`` case stops it there on purpose.
Stopped between a statement's parse and its execution, the session is "active", waiting
for the client, which no timeout of Postgres ends: the last test holds a worker's session
in that state, deterministically."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractContextManager, asynccontextmanager
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from api.auth import create_api_key
from api.db import create_engine
from api.outbox.relay import LOCK_ID as NUMBERING_LOCK
from api.webhooks import endpoints
from api.webhooks.destinations import AllowList
from api.webhooks.worker import TAG
from tests.api.webhooks.outbox_events import append
from tests.support.backend import Backend
from tests.support.eventually import eventually_async
from tests.support.leaders import api_process, stop_process, stop_while, stuck_session
from tests.support.receiver import Receiver
from tests.support.stalls import dsn

SECRET = "whsec_stuck"
LEASE = 2  # IDEMPAY_WEBHOOK_LEASE: seconds before Postgres ends a stopped leader's sessions
# each wait (a worker's start; the lease, the standby's 0.2 s poll for the lock and a tick)
# many times over: under a load of 11 on 2 cores a whole test took 17 s. A standby that
# never gets to deliver fails it whatever the margin.
WAIT = 15 * LEASE
# this database's holder of the numbering's transaction lock (every relay and webhook worker
# on the shared server takes the same lock id)
NUMBERING = (
    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = :lock AND granted "
    "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
)


def _worker(backend: Backend, log: Path) -> AbstractContextManager[subprocess.Popen[bytes]]:
    env = {
        **backend.env,
        "IDEMPAY_WEBHOOK_ALLOW_PRIVATE": "127.0.0.0/8",  # the receiver is local
        "IDEMPAY_WEBHOOK_LEASE": str(LEASE),
        "IDEMPAY_LOG_JSON": "false",
    }
    return api_process(["webhooks", "--interval", "0.1", "--timeout", "2"], env, log)


async def _anywhere(engine: AsyncEngine, pid: int) -> None:
    stop_process(pid)


async def _inside_numbering(engine: AsyncEngine, pid: int) -> None:
    """Stop the leader while its tick holds the numbering's transaction lock (each tick's
    ``number_committed`` takes it for one transaction of a few ms)."""
    async with engine.connect() as conn:

        async def held() -> bool:
            count = (await conn.execute(text(NUMBERING), {"lock": NUMBERING_LOCK})).scalar()
            await conn.commit()
            return bool(count)

        await stop_while(pid, held, what="the leader inside its numbering", within=WAIT)


@asynccontextmanager
async def _receiving(engine: AsyncEngine) -> AsyncIterator[Receiver]:
    """merchant-s, its webhooks sent to a receiver of the test's own."""
    await create_api_key(engine, "merchant-s")
    with Receiver(SECRET) as receiver:
        await endpoints.add(
            engine,
            "merchant-s",
            receiver.url,
            secret=SECRET,
            allow=AllowList.parse("127.0.0.1"),
        )
        yield receiver


async def _received(receiver: Receiver, count: int, what: str) -> None:
    await eventually_async(
        lambda: len(receiver.events),
        until=lambda seen: seen >= count,
        what=what,
        timeout=WAIT,
    )


@pytest.mark.parametrize("stop", [_anywhere, _inside_numbering], ids=lambda f: f.__name__[1:])
async def test_a_stopped_leader_loses_the_lock_to_a_standby(
    private_pg_backend: Backend,
    tmp_path: Path,
    stop: Callable[[AsyncEngine, int], Awaitable[None]],
) -> None:
    backend = private_pg_backend
    engine = create_engine(backend.settings)
    try:
        async with _receiving(engine) as receiver:

            async def received(count: int, what: str) -> None:
                await _received(receiver, count, what)

            first = await append(engine, "merchant-s", 2)
            with _worker(backend, tmp_path / "a.log") as leader:
                await received(2, "the leader to deliver the first events")
                with _worker(backend, tmp_path / "b.log"):
                    await stop(engine, leader.pid)
                    later = await append(engine, "merchant-s", 2)
                    await received(4, "the standby to lead and deliver while the leader is stopped")
                    os.kill(leader.pid, signal.SIGCONT)
                    more = await append(engine, "merchant-s", 1)
                    await received(5, "delivery to go on once the old leader runs again")
        log = (tmp_path / "a.log").read_text() + (tmp_path / "b.log").read_text()
    finally:
        await engine.dispose()
    assert [event["transaction_id"] for event in receiver.events] == first + later + more, log
    assert [event["seq"] for event in receiver.events] == [1, 2, 3, 4, 5]
    assert receiver.bad_signatures == 0


async def test_a_worker_stuck_mid_statement_loses_its_transaction_to_the_next(
    private_pg_backend: Backend, tmp_path: Path
) -> None:
    """A worker stopped after asyncpg parsed a new statement and before it ran it (a new
    statement on a session is prepared first, then bound) leaves its session "active",
    waiting for the rest, whatever ``idle_in_transaction_session_timeout`` says. Here such a
    session of another worker sits in the numbering's transaction: the worker that runs
    ends it once older than the lease, and numbers and delivers."""
    backend = private_pg_backend
    engine = create_engine(backend.settings)
    stuck = await stuck_session(
        dsn(backend),
        f"{TAG} stopped",
        "SELECT pg_advisory_xact_lock($1)",  # as a tick's
        NUMBERING_LOCK,
    )
    try:
        async with _receiving(engine) as receiver:
            sent = await append(engine, "merchant-s", 2)
            with _worker(backend, tmp_path / "a.log"):
                await _received(
                    receiver, 2, "the worker to end the stuck transaction, number and deliver"
                )
        log = (tmp_path / "a.log").read_text()
    finally:
        stuck.terminate()
        await engine.dispose()
    assert [event["transaction_id"] for event in receiver.events] == sent, log
    assert [event["seq"] for event in receiver.events] == [1, 2]
    assert "webhooks_stale_session_ended" in log
