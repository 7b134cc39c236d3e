"""The SQLite writer's connection settings and its checkpointer thread
(api/transactions/sqlite_create.py; docs/benchmarks.md, "The SQLite writer's page cache and
checkpointer"): the batch whose commit pushed the WAL past SQLite's default 1,000 pages used
to run the checkpoint — the database file's writes and fsync — before its creates were answered. A
thread of its own now copies the WAL back (PASSIVE) beside the writer; the writer's own checkpoint
is a backstop at ``WAL_BACKSTOP_PAGES``. Durability is unchanged: ``synchronous=FULL`` on every
connection, a commit answered only once its WAL frames are on disk."""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from api.transactions import sqlite_create
from api.transactions.sqlite_create import SqliteInline
from tests.support.backend import Backend
from tests.support.sqlite_events import event_row, sqlite_path, sqlite_writer


@pytest.fixture
async def inline(private_sqlite_backend: Backend) -> AsyncIterator[SqliteInline]:
    async with sqlite_writer(private_sqlite_backend) as writer:
        yield writer


def _in_database_file(path: str, merchant: str) -> int:
    """Rows of ``merchant`` in the database file itself, the WAL left out (``immutable``):
    what a checkpoint has copied back."""
    db = sqlite3.connect(f"file:{path}?immutable=1", uri=True)
    try:
        query = "SELECT count(*) FROM request_event WHERE merchant_id = ?"
        return int(db.execute(query, (merchant,)).fetchone()[0])
    finally:
        db.close()


def test_the_writers_connection_keeps_full_sync_and_sets_the_backstop(tmp_path: Any) -> None:
    path = str(tmp_path / "x.db")
    db = sqlite_create.connect(path, autocheckpoint=sqlite_create.WAL_BACKSTOP_PAGES)
    try:
        assert db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 20_000
        assert db.execute("PRAGMA cache_size").fetchone()[0] == -sqlite_create.CACHE_KIB
    finally:
        db.close()
    plain = sqlite_create.connect(path, read_only=True)
    try:  # the reader (and any other connection) keeps SQLite's own checkpoint setting
        assert plain.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 1000
        assert plain.execute("PRAGMA synchronous").fetchone()[0] == 2
    finally:
        plain.close()


async def test_committed_writes_reach_the_database_file_without_a_checkpoint_in_a_batch(
    private_sqlite_backend: Backend, inline: SqliteInline
) -> None:
    path = sqlite_path(private_sqlite_backend)
    merchant = f"m-{uuid.uuid4().hex[:8]}"
    await inline.write_events([event_row(merchant) for _ in range(20)])
    # answered: durable in the WAL, far below the writer's own checkpoint threshold; only
    # a checkpoint beside it copies them into the database file
    deadline = asyncio.get_running_loop().time() + 5.0
    copied = 0
    while asyncio.get_running_loop().time() < deadline:
        copied = await asyncio.to_thread(_in_database_file, path, merchant)
        if copied == 20:
            break
        await asyncio.sleep(0.05)
    assert copied == 20  # the checkpointer copied them back, beside the writer
    assert inline.checkpointer.runs > 0


async def test_close_stops_the_checkpointer(private_sqlite_backend: Backend) -> None:
    writer = SqliteInline(sqlite_path(private_sqlite_backend))
    await writer.write_events([event_row("m-close")])
    await writer.close()
    assert not writer.checkpointer._thread.is_alive()
