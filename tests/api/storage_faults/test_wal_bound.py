"""The embedded SQLite's WAL stays under its ceiling under steady load
(api/sqlite_wal.py, ``WalKeeper``; docs/operations.md, "The embedded
SQLite"): the writer restarts the WAL between batches once it passes ``WAL_RESTART_PAGES``.
Before, the PASSIVE checkpoints beside a writer that never stops could not restart it: it
grew with every batch, to the 20,000-page backstop (82 MB).

32 tasks keep the writer busy without a pause — request events, which ride the creates'
batches (one writer, one commit per batch) — until 100,000 rows are written, while the WAL
file's size is read after every write. ``python -m tests.api.storage_faults.steady
--seconds 300`` runs creates over HTTP for 5 minutes (the figure docs/operations.md
gives)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest

from api import sqlite_wal
from api.transactions.sqlite_create import SqliteInline
from idempay_tools._chaos_diskfull import WAL_CEILING_BYTES
from tests.support.backend import Backend
from tests.support.sqlite_events import event_row, sqlite_path

ROWS = 100_000
TASKS = 32


def _row() -> tuple[Any, ...]:
    return event_row("m-wal")


def _size(path: str) -> int:
    return os.stat(path).st_size


@pytest.mark.slow
async def test_the_wal_stays_under_its_ceiling_while_the_writer_never_stops(
    private_sqlite_backend: Backend,
) -> None:
    path = sqlite_path(private_sqlite_backend)
    wal = f"{path}-wal"
    inline = SqliteInline(path)
    written, largest = 0, 0

    async def writer() -> None:
        nonlocal written, largest
        while written < ROWS:
            await inline.write_events([_row() for _ in range(10)])
            written += 10
            largest = max(largest, _size(wal))

    try:
        await asyncio.gather(*(writer() for _ in range(TASKS)))
    finally:
        await inline.close()
    assert _size(path) > WAL_CEILING_BYTES  # the database outgrew the ceiling
    assert sqlite_wal.wal_limit_bytes() < largest <= WAL_CEILING_BYTES
    assert inline.wal.restarts > 0
