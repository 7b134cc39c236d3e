"""The lake's physical contract (contract §5): Arrow schemas and the day-partition writer.

One definition shared by ``idempay export`` (the server's data), ``idempay lake synth``
(synthetic data) and the tests. Layout::

    LAKE/request_events/event_date=YYYY-MM-DD/part-0.parquet   (by ts, UTC)
    LAKE/transactions/event_date=YYYY-MM-DD/part-0.parquet     (by created_at, UTC)
    LAKE/ledger_entries/event_date=YYYY-MM-DD/part-0.parquet   (by created_at, UTC)
    LAKE/<table>/event_date=YYYY-MM-DD/_manifest.json, _SUCCESS (analytics.manifest)
    LAKE/clearing/clearing_date=YYYY-MM-DD/…                    (analytics.clearing)

The partition column lives only in the directory name (Hive style); the files hold exactly
the contract's columns. A partition is replaced atomically: the new file is written under a
hidden temporary directory (readers skip names starting with ``.``) and renamed into place,
so a reader sees the old day or the new day, never a half-written one, and re-exporting a
day is idempotent.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterable, Iterator
from datetime import date
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from analytics import manifest

TIMESTAMP = pa.timestamp("us", tz="UTC")
PART_FILE = "part-0.parquet"

REQUEST_EVENTS = pa.schema(
    [
        ("event_id", pa.string()),
        ("ts", TIMESTAMP),
        ("merchant_id", pa.string()),
        ("terminal_id", pa.string()),
        ("idempotency_key", pa.string()),
        ("endpoint", pa.string()),
        ("outcome", pa.string()),
        ("http_status", pa.int32()),
        ("attempt", pa.int32()),
        ("network", pa.string()),
        ("latency_ms", pa.float64()),
    ]
)

TRANSACTIONS = pa.schema(
    [
        ("transaction_id", pa.string()),
        ("merchant_id", pa.string()),
        ("terminal_id", pa.string()),
        ("type", pa.string()),
        ("amount", pa.int64()),
        ("currency", pa.string()),
        ("card_fingerprint", pa.string()),
        ("status", pa.string()),
        ("created_at", TIMESTAMP),
        ("processed_at", TIMESTAMP),
        ("reversed_at", TIMESTAMP),
        # Added in lake schema 2 (issues 16 and 17), after the contract's columns: an
        # older partition lacks them and is read with them null (ADDED_COLUMNS).
        ("offline", pa.bool_()),
        ("captured_at", TIMESTAMP),
        ("duplicate_override", pa.bool_()),
        # Added in lake schema 3 (the acquirer link): the key's retrieval reference at the
        # acquirer, the approval's authorization code, a decline's reason. Null in older
        # partitions: their transactions cannot be reconciled with the clearing file.
        ("rrn", pa.string()),
        ("authorization_code", pa.string()),
        ("decline_reason", pa.string()),
    ]
)

LEDGER_ENTRIES = pa.schema(
    [
        ("entry_id", pa.string()),
        ("transaction_id", pa.string()),
        ("merchant_id", pa.string()),
        ("amount", pa.int64()),
        ("currency", pa.string()),
        ("kind", pa.string()),
        ("created_at", TIMESTAMP),
    ]
)

TABLES: dict[str, pa.Schema] = {
    "request_events": REQUEST_EVENTS,
    "transactions": TRANSACTIONS,
    "ledger_entries": LEDGER_ENTRIES,
}

# Columns added after lake schema 1, per table: a partition written before them is still
# the contract (it is read with them null, and re-exported with the database's values);
# only the contract's own columns are required.
ADDED_COLUMNS: dict[str, list[str]] = {
    "request_events": [],
    "transactions": [
        "offline",
        "captured_at",
        "duplicate_override",
        "rrn",
        "authorization_code",
        "decline_reason",
    ],
    "ledger_entries": [],
}


def required_columns(table: str) -> list[str]:
    """The table's contract columns (lake schema 1): a file without one is damaged."""
    return [name for name in TABLES[table].names if name not in ADDED_COLUMNS[table]]


# The column whose UTC date names the partition.
PARTITION_BY = {
    "request_events": "ts",
    "transactions": "created_at",
    "ledger_entries": "created_at",
}


def partition_dir(lake: Path, table: str, day: date) -> Path:
    return Path(lake) / table / f"event_date={day.isoformat()}"


def write_partition(
    lake: Path, table: str, day: date, batches: Iterable[pa.RecordBatch | pa.Table]
) -> tuple[Path, int]:
    """Replace ``table``'s partition for ``day`` with ``batches``; returns (file, rows).

    An empty iterable writes an empty file with the schema: the day was exported and had
    nothing, which a later re-export must be able to overwrite too. The file, its manifest
    and ``_SUCCESS`` are fsync'd, swapped in, and the directories fsync'd, before this
    returns: a caller may then record the rows as durable in the lake.
    """
    schema = TABLES[table]
    final = partition_dir(lake, table, day)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.tmp-{uuid.uuid4().hex}"
    tmp.mkdir()
    rows = 0
    try:
        with pq.ParquetWriter(tmp / PART_FILE, schema, compression="zstd") as writer:
            for batch in batches:
                part = batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])
                writer.write_table(part.cast(schema))
                rows += part.num_rows
        entry = manifest.describe(tmp / PART_FILE, rows)
        (tmp / manifest.MANIFEST).write_text(
            manifest.render(table, day, schema.names, [entry]), encoding="utf-8"
        )
        (tmp / manifest.SUCCESS).touch()
        for name in (PART_FILE, manifest.MANIFEST, manifest.SUCCESS):
            fsync_path(tmp / name)
        fsync_path(tmp)
        _swap_in(tmp, final)
        fsync_path(final)
        fsync_path(final.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final / PART_FILE, rows


def read_partition(lake: Path, table: str, day: date) -> pa.Table | None:
    """What the lake holds for ``table`` on ``day`` (every Parquet file of the partition),
    cast to the contract; None when the partition does not exist. A file written before a
    column was added (``ADDED_COLUMNS``) reads with that column null. Raises
    ``PartitionUnreadable`` when a file cannot be read as the contract."""
    schema = TABLES[table]
    final = partition_dir(lake, table, day)
    if not final.is_dir():
        return None
    parts = []
    for path in sorted(final.glob("*.parquet")):
        try:
            found = pq.read_table(path)
        except (OSError, pa.ArrowException) as exc:
            raise PartitionUnreadable(f"{path}: not readable as Parquet ({exc})") from exc
        missing = [name for name in required_columns(table) if name not in found.schema.names]
        if missing:
            raise PartitionUnreadable(f"{path}: lacks contract column(s) {', '.join(missing)}")
        for name in ADDED_COLUMNS[table]:
            if name not in found.schema.names:
                found = found.append_column(name, pa.nulls(found.num_rows, schema.field(name).type))
        try:
            parts.append(found.select(schema.names).cast(schema))
        except (pa.ArrowException, ValueError) as exc:
            raise PartitionUnreadable(
                f"{path}: columns do not cast to the contract ({exc})"
            ) from exc
    return pa.concat_tables(parts) if parts else schema.empty_table()


class PartitionUnreadable(Exception):
    """An existing partition that cannot be merged with: the caller must not replace it."""


_KEEP = {PART_FILE, manifest.MANIFEST, manifest.SUCCESS}


def _swap_in(tmp: Path, final: Path) -> None:
    """A new day is one directory rename; an existing day has its data file replaced by one
    rename, then its manifest and _SUCCESS (a reader between the two sees a checksum
    mismatch, never a silent mix)."""
    try:
        os.rename(tmp, final)
        return
    except OSError:
        if not final.is_dir():
            raise
    for name in (PART_FILE, manifest.MANIFEST, manifest.SUCCESS):
        os.replace(tmp / name, final / name)
    for stray in final.iterdir():  # files an older writer left under other names
        if stray.name not in _KEEP:
            if stray.is_dir():
                shutil.rmtree(stray)
            else:
                stray.unlink()


def fsync_path(path: Path) -> None:
    """fsync a file or a directory (a directory's fsync makes its renames durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def rows_to_batches(
    table: str, rows: Iterable[dict[str, object]], *, batch_rows: int = 50_000
) -> Iterator[pa.RecordBatch]:
    """Python row dicts (keys = the contract's columns) → record batches of the schema."""
    schema = TABLES[table]
    chunk: list[dict[str, object]] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) >= batch_rows:
            yield pa.RecordBatch.from_pylist(chunk, schema=schema)
            chunk = []
    if chunk:
        yield pa.RecordBatch.from_pylist(chunk, schema=schema)
