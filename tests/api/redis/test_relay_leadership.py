"""The relay's leadership is a Postgres session lock: when the session holding it dies (a
database restart drops every connection), the relay must notice and take the lock again
before it publishes — found by the chaos harness's PostgreSQL restart (before, the relay
kept publishing with no lock, so a standby relay could lead at the same time)."""

from __future__ import annotations

import asyncio
import time

from api.db import create_engine
from api.outbox.relay import LOCK_ID, Relay
from tests.support.backend import Backend

HOLDER = (
    "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objid = :lock "
    "AND granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
)


async def _holder(backend: Backend) -> int | None:
    rows = await asyncio.to_thread(backend.sql, HOLDER, lock=LOCK_ID)
    return int(rows[0][0]) if rows else None


async def _wait_holder(backend: Backend, *, other_than: int | None) -> int:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        pid = await _holder(backend)
        if pid is not None and pid != other_than:
            return pid
        await asyncio.sleep(0.1)
    raise AssertionError("no relay holds the leadership lock")


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
