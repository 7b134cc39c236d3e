"""On the embedded SQLite, request events are written by the hot path's writer thread
(``api.transactions.sqlite_create``), the flushes queued at one moment in one batch — one
transaction and one fsync. What must hold: each event lands once (a flush retried after an
error too), a failing flush undoes only itself (never another flush beside it) and is put
back by the event writer, and nothing is answered before its commit."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest

from api.db import create_engine
from api.events.writer import Event, EventWriter, RequestOutcome
from api.storage_errors import StorageUnavailableError
from api.transactions.sqlite_create import SqliteInline
from tests.support.backend import Backend
from tests.support.sqlite_events import event_row, sqlite_writer


def _row(merchant: str = "m-events", **overrides: Any) -> tuple[Any, ...]:
    return event_row(merchant, **{"latency_ms": 12.5, **overrides})


@pytest.fixture
async def inline(private_sqlite_backend: Backend) -> AsyncIterator[SqliteInline]:
    async with sqlite_writer(private_sqlite_backend) as writer:
        yield writer


async def _events(backend: Backend, merchant: str) -> list[Any]:
    return await asyncio.to_thread(
        backend.sql,
        "SELECT event_id, ts, outcome, latency_ms FROM request_event WHERE merchant_id = :m",
        m=merchant,
    )


async def test_events_land_once_in_the_writers_batch(
    private_sqlite_backend: Backend, inline: SqliteInline
) -> None:
    rows = [_row() for _ in range(5)]
    jobs = inline.writer.jobs
    await inline.write_events(rows)
    await inline.write_events(rows[:2])  # a flush retried after a lost answer: no second copy
    assert inline.writer.jobs == jobs + 2  # through the writer thread, not a connection of its own
    stored = await _events(private_sqlite_backend, "m-events")
    assert sorted(r[0] for r in stored) == sorted(r[0] for r in rows)
    # stored as SQLAlchemy's SQLite dialect stores a UTCDateTime: the lake reads them back
    assert all(len(r[1]) == len("2026-11-27 01:02:03.456789") for r in stored)
    assert {r[2] for r in stored} == {"created"} and {r[3] for r in stored} == {12.5}


async def test_a_failing_flush_undoes_itself_only(
    private_sqlite_backend: Backend, inline: SqliteInline
) -> None:
    good, bad = [_row("m-good")], [_row("m-bad"), _row("m-bad", endpoint=None)]  # NOT NULL
    results = await asyncio.gather(
        inline.write_events(bad), inline.write_events(good), return_exceptions=True
    )
    assert results[1] is None
    assert isinstance(results[0], Exception) and not isinstance(results[0], StorageUnavailableError)
    assert len(await _events(private_sqlite_backend, "m-good")) == 1
    assert await _events(private_sqlite_backend, "m-bad") == []  # the whole flush undone


async def test_the_event_writer_flushes_through_the_writer_and_puts_back_on_failure(
    private_sqlite_backend: Backend, inline: SqliteInline
) -> None:
    engine = create_engine(private_sqlite_backend.settings)
    try:
        writer = EventWriter(
            engine, citus=False, batch_size=100, interval=60, max_queue=1000, sqlite=inline
        )
        event = Event(
            ts=datetime.now(UTC),
            merchant_id="m-flush",
            terminal_id="T-9",
            idempotency_key=str(uuid.uuid4()),
            endpoint="create",
            outcome=RequestOutcome.CREATED,
            http_status=201,
            attempt=1,
            network=None,
            latency_ms=3.0,
        )
        for _ in range(3):
            writer.record(event)
        jobs = inline.writer.jobs
        assert await writer.flush() == 3
        assert inline.writer.jobs == jobs + 1
        assert len(await _events(private_sqlite_backend, "m-flush")) == 3
        # the table unwritable (a real failure of the statement): nothing lands, the rows go
        # back on the queue with their ids, and land once when the next flush succeeds
        writer.record(event)
        writer.record(event)
        rename = "ALTER TABLE {} RENAME TO {}"
        await asyncio.to_thread(
            private_sqlite_backend.sql, rename.format("request_event", "request_event_away")
        )
        assert await writer.flush() == 0
        assert len(writer._queue) == 2
        await asyncio.to_thread(
            private_sqlite_backend.sql, rename.format("request_event_away", "request_event")
        )
        assert await writer.flush() == 2
        assert len(await _events(private_sqlite_backend, "m-flush")) == 5
    finally:
        await engine.dispose()
