"""``idempay export --date D --lake DIR``: one UTC day of the database as lake partitions.

Reads with SQLAlchemy Core on the configured database (Postgres or the embedded SQLite):
``request_event`` by ``ts``, ``transaction`` and ``ledger_entry`` by ``created_at``, each
selected column by column under its contract §5 name, so nothing outside the contract (no card
token, no stored request, no metadata) can reach the lake.

One export of day D, in order:
1. takes the lake's lock of each (table, D) — an export of the same day that is already
   running makes this one wait (it says so), so two exports never interleave;
2. reads the three tables in one snapshot (REPEATABLE READ on Postgres, one read
   transaction on SQLite): the partitions agree with each other;
3. merges each with what the lake already holds for D — rows the database no longer has
   (request events retention purged) are kept, the database's version of a row wins — or
   refuses, saying why, when the lake's partition cannot be read as the contract;
4. writes each partition atomically with its manifest (``analytics.lake.write_partition``,
   which fsyncs the files and the directories before it returns);
5. marks ``exported_at`` on exactly the request events it read, all now in the lake.
Retention deletes only marked events, so it never deletes one the lake lacks.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]
from sqlalchemy import Select, select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from analytics.lake import TABLES, PartitionUnreadable, read_partition, write_partition
from api.db import atomic, utcnow
from api.models import LedgerEntry, RequestEvent, Transaction

FETCH_ROWS = 50_000
MARK_CHUNK = 1_000


@dataclass(slots=True)
class ExportResult:
    day: date
    files: dict[str, Path] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=dict)
    kept_from_lake: dict[str, int] = field(default_factory=dict)
    marked: int = 0


def day_bounds(day: date) -> tuple[datetime, datetime]:
    start = datetime.combine(day, time.min, tzinfo=UTC)
    return start, start + timedelta(days=1)


def _request_events(start: datetime, end: datetime) -> Select[Any]:
    e = RequestEvent.__table__.c
    return (
        select(
            e.event_id,
            e.ts,
            e.merchant_id,
            e.terminal_id,
            e.idempotency_key,
            e.endpoint,
            e.outcome,
            e.http_status,
            e.attempt,
            e.network,
            e.latency_ms,
        )
        .where(e.ts >= start, e.ts < end)
        .order_by(e.ts, e.event_id)
    )


def _transactions(start: datetime, end: datetime) -> Select[Any]:
    t = Transaction.__table__.c
    return (
        select(
            t.id.label("transaction_id"),
            t.merchant_id,
            t.terminal_id,
            t.type,
            t.amount,
            t.currency,
            t.card_fingerprint,
            t.status,
            t.created_at,
            t.processed_at,
            t.reversed_at,
            # lake schema 2: an offline advice (contract §2.2) and when it was sold
            # (migration 0006); a suspected duplicate the cashier confirmed (0010)
            t.offline,
            t.captured_at,
            t.duplicate_override,
            # lake schema 3: the acquirer's retrieval reference (migration 0013), the
            # approval's code, a decline's reason — the settlement reconciliation's inputs
            t.rrn,
            t.authorization_code,
            t.decline_reason,
        )
        .where(t.created_at >= start, t.created_at < end)
        .order_by(t.created_at, t.merchant_id, t.id)
    )


def _ledger_entries(start: datetime, end: datetime) -> Select[Any]:
    le = LedgerEntry.__table__.c
    return (
        select(
            le.entry_id,
            le.transaction_id,
            le.merchant_id,
            le.amount,
            le.currency,
            le.kind,
            le.created_at,
        )
        .where(le.created_at >= start, le.created_at < end)
        .order_by(le.created_at, le.entry_id)
    )


QUERIES = {
    "request_events": _request_events,
    "transactions": _transactions,
    "ledger_entries": _ledger_entries,
}


KEYS = {
    "request_events": ["event_id"],
    "transactions": ["merchant_id", "transaction_id"],
    "ledger_entries": ["entry_id"],
}
ORDER = {
    "request_events": ["ts", "event_id"],
    "transactions": ["created_at", "merchant_id", "transaction_id"],
    "ledger_entries": ["created_at", "entry_id"],
}


class ExportRefusedError(Exception):
    """The lake holds a partition the export cannot merge with; nothing was replaced."""


async def _read_snapshot(
    engine: AsyncEngine, start: datetime, end: datetime
) -> dict[str, pa.Table]:
    """The day's three tables as of one instant."""
    tables: dict[str, pa.Table] = {}
    async with engine.connect() as conn:
        if conn.dialect.name == "postgresql":
            await conn.execution_options(isolation_level="REPEATABLE READ")
        else:
            await conn.execution_options(sqlite_deferred_begin=True)  # a read snapshot
        async with conn.begin():
            for table, query in QUERIES.items():
                tables[table] = await _fetch(conn, table, query(start, end))
    return tables


async def _fetch(conn: AsyncConnection, table: str, statement: Select[Any]) -> pa.Table:
    schema = TABLES[table]
    if list(statement.selected_columns.keys()) != schema.names:  # the contract, every run
        raise RuntimeError(f"{table}: selected columns drift from the lake schema")
    batches: list[pa.RecordBatch] = []
    result = await conn.stream(statement)
    async for rows in result.partitions(FETCH_ROWS):
        columns = list(zip(*rows, strict=True))
        arrays = [
            pa.array(values, type=column.type)
            for values, column in zip(columns, schema, strict=True)
        ]
        batches.append(pa.RecordBatch.from_arrays(arrays, schema=schema))
    return pa.Table.from_batches(batches, schema=schema)


def _key(table: str, rows: pa.Table) -> pa.Array:
    columns = KEYS[table]
    if len(columns) == 1:
        return rows.column(columns[0])
    return pc.binary_join_element_wise(*(rows.column(c) for c in columns), "\x1f")


def merge(table: str, database: pa.Table, lake: pa.Table | None) -> tuple[pa.Table, int]:
    """The database's rows plus the lake's rows the database no longer has, in a stable
    order; returns (rows, how many came only from the lake)."""
    kept = 0
    merged = database
    if lake is not None and lake.num_rows:
        only_in_lake = lake.filter(pc.invert(pc.is_in(_key(table, lake), _key(table, database))))
        kept = only_in_lake.num_rows
        merged = pa.concat_tables([database, only_in_lake])
    return merged.sort_by([(name, "ascending") for name in ORDER[table]]), kept


@contextlib.asynccontextmanager
async def _partition_lock(
    lake: Path, table: str, day: date, on_wait: Callable[[str], None]
) -> AsyncIterator[None]:
    """An exclusive lock of (table, day) in the lake: ``LAKE/.locks/<table>.event_date=D``
    (beside the tables, so no reader of a table ever sees it)."""
    folder = Path(lake) / ".locks"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{table}.event_date={day.isoformat()}.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            on_wait(f"waiting: another export of {table}/event_date={day} is running ({path})")
            await asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


async def _mark_exported(engine: AsyncEngine, event_ids: Sequence[str], now: datetime) -> int:
    marked = 0
    async with atomic(engine) as conn:
        for offset in range(0, len(event_ids), MARK_CHUNK):
            chunk = event_ids[offset : offset + MARK_CHUNK]
            result = await conn.execute(
                update(RequestEvent)
                .where(RequestEvent.event_id.in_(chunk), RequestEvent.exported_at.is_(None))
                .values(exported_at=now)
            )
            marked += result.rowcount or 0
    return marked


async def export_day(
    engine: AsyncEngine,
    lake: Path,
    day: date,
    *,
    on_wait: Callable[[str], None] = lambda _message: None,
) -> ExportResult:
    """Write the day's three partitions (merged with the lake's), then mark its request
    events exported. Raises ``ExportRefusedError`` (and replaces nothing) when a partition
    in the lake cannot be read as the contract."""
    start, end = day_bounds(day)
    result = ExportResult(day=day)
    async with contextlib.AsyncExitStack() as locks:
        for table in QUERIES:  # always in the same order: two exports cannot deadlock
            await locks.enter_async_context(_partition_lock(lake, table, day, on_wait))
        snapshot = await _read_snapshot(engine, start, end)
        merged: dict[str, pa.Table] = {}
        for table, rows in snapshot.items():
            try:
                held = read_partition(lake, table, day)
            except PartitionUnreadable as exc:
                raise ExportRefusedError(
                    f"{table}/event_date={day} left as it is: {exc}. Move it aside, then "
                    "export again (the database's rows are exported; rows only that "
                    "partition held must be restored from it by hand)."
                ) from exc
            merged[table], result.kept_from_lake[table] = merge(table, rows, held)
        for table, rows in merged.items():
            result.files[table], result.rows[table] = write_partition(lake, table, day, [rows])
        event_ids = snapshot["request_events"].column("event_id").to_pylist()
        result.marked = await _mark_exported(engine, event_ids, utcnow())
    return result
