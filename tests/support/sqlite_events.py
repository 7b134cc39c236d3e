"""Request-event rows for the embedded SQLite's writer thread (``SqliteInline``), and the
writer on a private SQLite backend."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

from api.events.writer import COLUMNS
from api.transactions.sqlite_create import SqliteInline
from tests.support.backend import Backend


def event_row(merchant: str, **overrides: Any) -> tuple[Any, ...]:
    """One request event of ``merchant`` (a create answered 201), in ``COLUMNS`` order."""
    values = {
        "event_id": str(uuid.uuid4()),
        "ts": datetime.now(UTC),
        "merchant_id": merchant,
        "terminal_id": "T-1",
        "idempotency_key": str(uuid.uuid4()),
        "endpoint": "create",
        "outcome": "created",
        "http_status": 201,
        "attempt": 1,
        "network": "3g",
        "latency_ms": 1.5,
        **overrides,
    }
    return tuple(values[column] for column in COLUMNS)


def sqlite_path(backend: Backend) -> str:
    """The SQLite backend's database file."""
    return backend.url.split("///", 1)[1]


@asynccontextmanager
async def sqlite_writer(backend: Backend) -> AsyncIterator[SqliteInline]:
    """The backend's writer thread, closed at the exit."""
    writer = SqliteInline(sqlite_path(backend))
    try:
        yield writer
    finally:
        await writer.close()
