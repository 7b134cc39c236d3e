"""Hand-built lake rows for the analytics tests: every value is written out by hand."""

from __future__ import annotations

import math
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import DateType, DoubleType, LongType, StringType, StructField, StructType

from analytics import schemas
from analytics.lake import rows_to_batches, write_partition
from analytics.metrics import COUNT_COLUMNS, SUMMARY_COLUMNS

D0, D1, D2, D3 = date(2026, 11, 19), date(2026, 11, 20), date(2026, 11, 21), date(2026, 11, 22)

STATUS = {
    "created": 201,
    "replayed": 201,
    "in_progress": 409,
    "key_reused": 422,
    "expired": 410,
    "rejected": 422,
    "error": 503,
    "found": 200,
    "processing": 202,
    "not_found": 404,
    "aborted": 200,
    "reversed": 200,
}
_serial = iter(range(1, 1_000_000))


def at(moment: str) -> datetime:
    """'2026-11-20 10:00:00.5' → an aware UTC datetime."""
    return datetime.fromisoformat(moment).replace(tzinfo=UTC)


def ev(
    key: str,
    moment: str,
    endpoint: str,
    outcome: str,
    *,
    merchant: str = "mer_a",
    terminal: str | None = "T-1",
    latency: float = 1.0,
    network: str | None = "gprs",
    attempt: int | None = None,
) -> dict[str, Any]:
    return {
        "event_id": f"ev-{next(_serial)}",
        "ts": at(moment),
        "merchant_id": merchant,
        "terminal_id": terminal,
        "idempotency_key": key,
        "endpoint": endpoint,
        "outcome": outcome,
        "http_status": STATUS[outcome],
        "attempt": attempt,
        "network": network,
        "latency_ms": float(latency),
    }


def txn(
    transaction_id: str,
    moment: str,
    *,
    merchant: str = "mer_a",
    terminal: str = "T-1",
    card: str = "fp-card-1",
    amount: int = 1250,
    currency: str = "BRL",
    status: str = "approved",
    type_: str = "purchase",
    offline: bool = False,
    captured: str | None = None,
    override: bool = False,
    rrn: str | None = None,
    authorization_code: str | None = None,
    decline_reason: str | None = None,
) -> dict[str, Any]:
    created = at(moment)
    return {
        "transaction_id": transaction_id,
        "merchant_id": merchant,
        "terminal_id": terminal,
        "type": type_,
        "amount": amount,
        "currency": currency,
        "card_fingerprint": card,
        "status": status,
        "created_at": created,
        "processed_at": created,
        "reversed_at": None,
        "offline": offline,
        "captured_at": at(captured) if captured else None,
        "duplicate_override": override,
        "rrn": rrn,
        "authorization_code": authorization_code,
        "decline_reason": decline_reason,
    }


def entry(
    entry_id: str,
    transaction_id: str,
    moment: str,
    *,
    merchant: str = "mer_a",
    amount: int = 1250,
    kind: str = "charge",
) -> dict[str, Any]:
    return {
        "entry_id": entry_id,
        "transaction_id": transaction_id,
        "merchant_id": merchant,
        "amount": amount,
        "currency": "BRL",
        "kind": kind,
        "created_at": at(moment),
    }


def frame(spark: SparkSession, table: str, rows: list[dict[str, Any]]) -> DataFrame:
    schema = schemas.TABLES[table]
    return spark.createDataFrame([tuple(r[f.name] for f in schema) for r in rows], schema)


def write_lake(lake: Path, table: str, rows: list[dict[str, Any]], *, empty_day: date = D1) -> None:
    """Rows into day partitions (by the table's timestamp), as the exporter writes them; no
    rows: one empty partition (``empty_day``), as the exporter writes a quiet day."""
    column = "ts" if table == "request_events" else "created_at"
    days = sorted({r[column].date() for r in rows}) or [empty_day]
    for day in days:
        chosen = [r for r in rows if r[column].date() == day]
        write_partition(lake, table, day, rows_to_batches(table, chosen))


def as_dicts(rows: list[tuple[Any, ...]], columns: list[str]) -> list[dict[str, Any]]:
    """Expected rows (tuples in ``columns`` order) as dicts, dates as ISO strings: the shape
    ``analytics.duckdb_reference`` answers in."""
    return [
        {c: v.isoformat() if isinstance(v, date) else v for c, v in zip(columns, row, strict=True)}
        for row in rows
    ]


def assert_rows_equal(actual: list[dict[str, Any]], expected: list[dict[str, Any]]) -> None:
    """Same rows in the same order: every column equal (floats to 1e-9 relative)."""
    assert len(actual) == len(expected), f"{len(actual)} rows, expected {len(expected)}"
    assert [list(r) for r in actual] == [list(r) for r in expected], "columns differ"
    for got, want in zip(actual, expected, strict=True):
        for column, value in want.items():
            other = got[column]
            if isinstance(value, float) and other is not None:
                assert math.isclose(other, value, rel_tol=1e-9, abs_tol=1e-12), (column, got)
            else:
                assert other == value, (column, got, want)


SUMMARY_SCHEMA = StructType(
    [StructField("event_date", DateType()), StructField("merchant_id", StringType())]
    + [
        StructField(name, LongType() if name in COUNT_COLUMNS else DoubleType())
        for name in SUMMARY_COLUMNS[2:]
    ]
)


def summary_row(day: date, merchant: str, **metrics: Any) -> tuple[Any, ...]:
    """A daily_summary row: counts default to 0, rates to 0.0, percentiles to None."""
    defaults: dict[str, Any] = {name: 0 for name in COUNT_COLUMNS}
    defaults.update(
        retry_rate=0.0,
        link_loss_rate=0.0,
        duplicate_rate=0.0,
        in_doubt_rate=0.0,
        lookup_found_rate=0.0,
        acquirer_timeout_rate=0.0,
    )
    unknown = set(metrics) - set(SUMMARY_COLUMNS)
    assert not unknown, unknown
    values = {**defaults, **metrics}
    return (day, merchant, *(values.get(name) for name in SUMMARY_COLUMNS[2:]))
