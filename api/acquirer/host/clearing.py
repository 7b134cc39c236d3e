"""The acquirer's daily clearing file (SPEC §2.9) and its reader.

A CSV with a header row and the columns :data:`COLUMNS`: one ``D`` row per authorization
the acquirer approved on day D (``approved_at`` on the acquirer's clock, UTC), with
``reversed_at`` empty when it was not reversed (when the file was written) and the last
two columns empty; then one ``T`` trailer with only ``record_count`` (the number of ``D``
rows) and ``net_amount`` (Σ amount of the unreversed ``D`` rows, refunds — processing code
``20xxxx`` — negative). The file is written to a temporary name beside ``out`` and renamed,
so a reader never sees half of it. :func:`read_clearing` refuses a file whose trailer
disagrees with its rows (truncated, edited, appended to).
"""

from __future__ import annotations

import csv
import io
import os
import sqlite3
import tempfile
from contextlib import closing
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path

__all__ = [
    "COLUMNS",
    "Clearing",
    "ClearingFileError",
    "ClearingRecord",
    "read_clearing",
    "write_clearing",
]

COLUMNS = (
    "record_type",
    "rrn",
    "stan",
    "merchant_id",
    "terminal_id",
    "processing_code",
    "amount",
    "currency",
    "authorization_code",
    "approved_at",
    "reversed_at",
    "record_count",
    "net_amount",
)


class ClearingFileError(ValueError):
    """The clearing file is malformed or its trailer disagrees with its rows."""


@dataclass(frozen=True, slots=True)
class ClearingRecord:
    rrn: str
    stan: str
    merchant_id: str
    terminal_id: str
    processing_code: str
    amount: int
    currency: str
    authorization_code: str
    approved_at: str
    reversed_at: str | None

    @property
    def signed_amount(self) -> int:
        """The amount as it moves money: refunds (processing code ``20…``) negative."""
        return -self.amount if self.processing_code.startswith("20") else self.amount


@dataclass(frozen=True, slots=True)
class Clearing:
    records: tuple[ClearingRecord, ...]
    record_count: int
    net_amount: int


def _net(records: list[ClearingRecord] | tuple[ClearingRecord, ...]) -> int:
    return sum(r.signed_amount for r in records if r.reversed_at is None)


def _approved_on(store: Path, day: date) -> list[ClearingRecord]:
    if not store.exists():
        raise FileNotFoundError(f"no acquirer store at {store}")
    start, end = day.isoformat(), (day + timedelta(days=1)).isoformat()
    with closing(sqlite3.connect(f"file:{store}?mode=ro", uri=True)) as conn:
        rows = conn.execute(
            "SELECT rrn, stan, merchant_id, terminal_id, processing_code, amount, currency,"
            " authorization_code, approved_at, reversed_at FROM authorization"
            " WHERE state = 'approved' AND approved_at >= ? AND approved_at < ?"
            " ORDER BY approved_at, rrn",
            (start, end),
        ).fetchall()
    return [ClearingRecord(*row) for row in rows]


def write_clearing(store: Path, *, day: date, out: Path) -> Clearing:
    """Write day ``day``'s clearing file to ``out`` atomically; return what it holds."""
    records = _approved_on(store, day)
    clearing = Clearing(tuple(records), len(records), _net(records))
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(COLUMNS)
    for r in records:
        writer.writerow(
            [
                "D",
                r.rrn,
                r.stan,
                r.merchant_id,
                r.terminal_id,
                r.processing_code,
                r.amount,
                r.currency,
                r.authorization_code,
                r.approved_at,
                r.reversed_at or "",
                "",
                "",
            ]
        )
    writer.writerow(["T", *[""] * (len(COLUMNS) - 3), clearing.record_count, clearing.net_amount])
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(buffer.getvalue())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return clearing


def _int(value: str, what: str, line: int) -> int:
    try:
        return int(value)
    except ValueError:
        raise ClearingFileError(f"line {line}: {what} {value!r} is not an integer") from None


def read_clearing(path: Path | str) -> Clearing:
    """Read a clearing file and check it: header, one trailer last, count and net amount."""
    with Path(path).open(encoding="utf-8", newline="") as f:
        rows = list(csv.reader(f))
    if not rows or tuple(rows[0]) != COLUMNS:
        raise ClearingFileError(f"{path}: header is not {','.join(COLUMNS)}")
    if len(rows) < 2 or rows[-1][:1] != ["T"]:
        raise ClearingFileError(f"{path}: no trailer (T) row at the end — truncated?")
    records: list[ClearingRecord] = []
    for line, row in enumerate(rows[1:-1], start=2):
        if len(row) != len(COLUMNS) or row[0] != "D" or any(row[11:]):
            raise ClearingFileError(f"{path}: line {line} is not a D record")
        records.append(
            ClearingRecord(
                row[1],
                row[2],
                row[3],
                row[4],
                row[5],
                _int(row[6], "amount", line),
                row[7],
                row[8],
                row[9],
                row[10] or None,
            )
        )
    trailer, last = rows[-1], len(rows)
    if len(trailer) != len(COLUMNS) or any(trailer[1:11]):
        raise ClearingFileError(f"{path}: line {last}: a trailer holds only its two totals")
    count = _int(trailer[11], "record_count", last)
    net = _int(trailer[12], "net_amount", last)
    if count != len(records):
        raise ClearingFileError(
            f"{path}: trailer says {count} records, the file holds {len(records)}"
        )
    if net != _net(records):
        raise ClearingFileError(
            f"{path}: trailer says net amount {net}, the records sum to {_net(records)}"
        )
    return Clearing(tuple(records), count, net)
