"""The acquirer's clearing files in the lake (contract §2.9, §5): ``clearing/clearing_date=D/``.

One partition per clearing day, written as delivered: the ``D`` rows' columns
(:data:`CLEARING`) in ``part-0.parquet``, and in ``_manifest.json`` besides the usual
checksums the file's trailer (``record_count``, ``net_amount``) and the SHA-256 and name of
the file it came from. A partition is written only after its rows agree with their trailer
(:func:`check_trailer`), and the audit checks them again when it reads (:func:`verify`): a
clearing day that disagrees is refused whole, never half-read.

Landing (:func:`land`) is idempotent: the same file (same SHA-256) for a day already landed
changes nothing; a different file for that day is refused unless ``replace``. The day is
the UTC date of the rows' ``approved_at`` (the acquirer's clock); an empty file names no
day, so the caller must.

Amounts are as the file has them (unsigned minor units); a refund is processing code
``20xxxxx`` and moves money the other way (:func:`signed_amount`).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from analytics import manifest
from analytics.lake import PART_FILE, TIMESTAMP, _swap_in, fsync_path

TABLE = "clearing"
PARTITION = "clearing_date"
CLEARING = pa.schema(
    [
        ("rrn", pa.string()),
        ("stan", pa.string()),
        ("merchant_id", pa.string()),
        ("terminal_id", pa.string()),
        ("processing_code", pa.string()),
        ("amount", pa.int64()),
        ("currency", pa.string()),
        ("authorization_code", pa.string()),
        ("approved_at", TIMESTAMP),
        ("reversed_at", TIMESTAMP),
    ]
)
REFUND_PREFIX = "20"


class ClearingRefusedError(Exception):
    """The clearing file was not landed (it disagrees with its trailer, with its day, or
    with the file already landed for that day); nothing was written."""


@dataclass(frozen=True, slots=True)
class Landed:
    day: date
    path: Path
    rows: int
    net_amount: int
    outcome: str  # landed | unchanged | replaced


def partition_dir(lake: Path, day: date) -> Path:
    return Path(lake) / TABLE / f"{PARTITION}={day.isoformat()}"


def _timestamp(text: str | None) -> datetime | None:
    if not text:
        return None
    moment = datetime.fromisoformat(text)
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def from_records(records: Sequence[dict[str, Any]]) -> pa.Table:
    """The ``D`` rows (dicts of the file's columns, timestamps as ISO text) as Arrow rows."""
    rows = [
        {
            **{name: record[name] for name in CLEARING.names},
            "amount": int(record["amount"]),
            "approved_at": _timestamp(record["approved_at"]),
            "reversed_at": _timestamp(record["reversed_at"]),
        }
        for record in records
    ]
    return pa.Table.from_pylist(rows, schema=CLEARING)


def signed_amount(rows: pa.Table) -> pa.Array:
    """``amount`` as it moves money: a refund (processing code ``20…``) negative."""
    is_refund = pc.starts_with(rows["processing_code"], REFUND_PREFIX)
    return pc.if_else(is_refund, pc.negate(rows["amount"]), rows["amount"])


def net_amount(rows: pa.Table) -> int:
    """Σ signed amount of the rows not reversed: the trailer's ``net_amount``."""
    open_rows = pc.is_null(rows["reversed_at"])
    total = pc.sum(pc.if_else(open_rows, signed_amount(rows), 0)).as_py()
    return int(total or 0)


def check_trailer(rows: pa.Table, *, record_count: int, net: int) -> None:
    if rows.num_rows != record_count:
        raise ClearingRefusedError(
            f"trailer says {record_count} records, the rows are {rows.num_rows}"
        )
    if net_amount(rows) != net:
        raise ClearingRefusedError(
            f"trailer says net amount {net}, the rows sum to {net_amount(rows)}"
        )


def day_of(rows: pa.Table, stated: date | None) -> date:
    """The clearing day: the UTC date of every row's ``approved_at`` (one date), which
    ``stated`` must be when given; an empty file's day must be stated."""
    days = {moment.date() for moment in rows["approved_at"].to_pylist()}
    if len(days) > 1:
        listed = ", ".join(sorted(d.isoformat() for d in days))
        raise ClearingRefusedError(f"rows approved on more than one day ({listed})")
    if stated is not None and days and days != {stated}:
        raise ClearingRefusedError(f"rows approved on {days.pop()}, not on {stated}")
    if stated is None and not days:
        raise ClearingRefusedError("no D rows: the file names no day (give --date)")
    return stated if stated is not None else days.pop()


def landed_manifest(lake: Path, day: date) -> dict[str, Any] | None:
    path = partition_dir(lake, day) / manifest.MANIFEST
    if not path.is_file():
        return None
    body: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return body


@contextmanager
def _day_lock(lake: Path, day: date) -> Iterator[None]:
    folder = Path(lake) / ".locks"
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / f"{TABLE}.{PARTITION}={day.isoformat()}.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def land(
    lake: Path,
    rows: pa.Table,
    *,
    record_count: int,
    net: int,
    source_sha256: str,
    source_name: str,
    day: date | None = None,
    replace: bool = False,
) -> Landed:
    """Check ``rows`` against their trailer and day, then write them as the day's
    partition (atomically: a reader sees the old day or the new one). Raises
    ``ClearingRefusedError`` — nothing written — when they disagree, or when another file
    is landed for the day and not ``replace``."""
    rows = rows.cast(CLEARING)
    check_trailer(rows, record_count=record_count, net=net)
    day = day_of(rows, day)
    with _day_lock(lake, day):
        held = landed_manifest(lake, day)
        if held is not None and held.get("source_sha256") == source_sha256:
            path = partition_dir(lake, day) / PART_FILE
            return Landed(day, path, rows.num_rows, net, "unchanged")
        if held is not None and not replace:
            raise ClearingRefusedError(
                f"a different clearing file ({held.get('source_name')}, sha256 "
                f"{str(held.get('source_sha256'))[:12]}…) is already landed for {day}: "
                "nothing changed (--replace to replace it)"
            )
        extra = {
            "record_count": record_count,
            "net_amount": net,
            "source_sha256": source_sha256,
            "source_name": source_name,
        }
        path = _write(lake, day, rows, extra)
    return Landed(day, path, rows.num_rows, net, "landed" if held is None else "replaced")


def land_rows(lake: Path, day: date, rows: pa.Table, *, source_name: str) -> Landed:
    """A day's rows whose trailer is computed here (the synthesized lake): always written."""
    rows = rows.cast(CLEARING)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, CLEARING) as writer:
        writer.write_table(rows)
    digest = hashlib.sha256(sink.getvalue().to_pybytes()).hexdigest()  # names the content
    return land(
        lake,
        rows,
        record_count=rows.num_rows,
        net=net_amount(rows),
        source_sha256=digest,
        source_name=source_name,
        day=day,
        replace=True,
    )


def _write(lake: Path, day: date, rows: pa.Table, extra: dict[str, Any]) -> Path:
    final = partition_dir(lake, day)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.tmp-{uuid.uuid4().hex}"
    tmp.mkdir()
    try:
        pq.write_table(rows, tmp / PART_FILE, compression="zstd")
        entry = manifest.describe(tmp / PART_FILE, rows.num_rows)
        text = manifest.render(TABLE, day, CLEARING.names, [entry], extra=extra)
        (tmp / manifest.MANIFEST).write_text(text, encoding="utf-8")
        (tmp / manifest.SUCCESS).touch()
        for name in (PART_FILE, manifest.MANIFEST, manifest.SUCCESS):
            fsync_path(tmp / name)
        fsync_path(tmp)
        _swap_in(tmp, final)
        fsync_path(final)
        fsync_path(final.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final / PART_FILE


# ------------------------------------------------------------------ reading back
def partitions(lake: Path) -> Iterator[tuple[date, Path]]:
    """The lake's ``clearing_date=YYYY-MM-DD`` directories (others are not partitions)."""
    root = Path(lake) / TABLE
    if not root.is_dir():
        return
    for folder in sorted(root.iterdir()):
        name, _, value = folder.name.partition("=")
        if not folder.is_dir() or name != PARTITION:
            continue
        try:
            yield date.fromisoformat(value), folder
        except ValueError:
            continue


def verify(folder: Path) -> list[str]:
    """What is wrong with a landed clearing day ([] when its files are as written and its
    rows still agree with the trailer it was landed with)."""
    found = manifest.problems(folder, columns=CLEARING.names)
    if found:
        return found
    body = json.loads((folder / manifest.MANIFEST).read_text(encoding="utf-8"))
    files = sorted(folder.glob("*.parquet"))
    rows = pa.concat_tables(
        [pq.read_table(f).cast(CLEARING) for f in files] or [CLEARING.empty_table()]
    )
    try:
        check_trailer(rows, record_count=int(body["record_count"]), net=int(body["net_amount"]))
    except (ClearingRefusedError, KeyError, ValueError) as exc:
        return [f"rows disagree with the landed trailer: {exc}"]
    return []
