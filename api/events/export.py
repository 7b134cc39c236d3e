"""``idempay export --date D --lake DIR``: one UTC day of the database as lake partitions.

Reads with SQLAlchemy Core on the configured database (Postgres or the embedded SQLite):
``request_event`` by ``ts``, ``transaction`` and ``ledger_entry`` by ``created_at``, each
selected column by column under its SPEC §5 name, so nothing outside the contract (no card
token, no stored request, no metadata) can reach the lake. Each partition is replaced
atomically (``analytics.lake.write_partition``), so exporting a day twice gives the same
lake. Request events are marked ``exported_at`` only after every partition of the day is in
place; retention deletes only marked events.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
from sqlalchemy import Select, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from analytics.lake import TABLES, write_partition
from api.db import atomic, utcnow
from api.models import LedgerEntry, RequestEvent, Transaction

FETCH_ROWS = 50_000
MARK_CHUNK = 1_000


@dataclass(frozen=True, slots=True)
class ExportResult:
    day: date
    files: dict[str, Path] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=dict)
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


async def _fetch(engine: AsyncEngine, table: str, statement: Select[Any]) -> list[pa.RecordBatch]:
    schema = TABLES[table]
    if list(statement.selected_columns.keys()) != schema.names:  # the contract, every run
        raise RuntimeError(f"{table}: selected columns drift from the lake schema")
    batches: list[pa.RecordBatch] = []
    async with engine.connect() as conn:
        result = await conn.stream(statement)
        async for rows in result.partitions(FETCH_ROWS):
            columns = list(zip(*rows, strict=True))
            arrays = [
                pa.array(values, type=column.type)
                for values, column in zip(columns, schema, strict=True)
            ]
            batches.append(pa.RecordBatch.from_arrays(arrays, schema=schema))
    return batches


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


async def export_day(engine: AsyncEngine, lake: Path, day: date) -> ExportResult:
    """Write the day's three partitions, then mark its request events exported."""
    start, end = day_bounds(day)
    result = ExportResult(day=day)
    event_ids: list[str] = []
    for table, query in QUERIES.items():
        batches = await _fetch(engine, table, query(start, end))
        if table == "request_events":
            event_ids = [i for batch in batches for i in batch.column(0).to_pylist()]
        path, rows = write_partition(lake, table, day, batches)
        result.files[table] = path
        result.rows[table] = rows
    marked = await _mark_exported(engine, event_ids, utcnow())
    return ExportResult(day=day, files=result.files, rows=result.rows, marked=marked)
