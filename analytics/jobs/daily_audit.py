"""The daily audit job: read the lake → transforms → write the outputs (SPEC §5).

    spark-submit analytics/jobs/daily_audit.py --from 2026-11-01 --to 2026-11-07 \\
        --lake lake --out out [--master local[2]]

(or ``idempay audit`` with the same options). The whole lake is read, because a key's
metrics use all of its events whatever their date; only rows dated within --from..--to
(inclusive) are written. Outputs in --out: ``<table>.csv`` (one file with a header) and a
``<table>/`` Parquet folder for daily_summary, terminal_ranking, suspected_double_charges,
exactly_once_violations, network_rates and daily_trend, plus ``report.html``.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import date
from functools import reduce
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file by spark-submit: make `analytics` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import pyarrow.parquet as pq  # noqa: E402
from pyspark.sql import DataFrame, SparkSession  # noqa: E402

from analytics import report, schemas, transforms  # noqa: E402
from analytics.session import build_session  # noqa: E402

OUTPUTS = [
    "daily_summary",
    "terminal_ranking",
    "suspected_double_charges",
    "exactly_once_violations",
    "network_rates",
    "daily_trend",
]


@dataclass
class AuditResult:
    out: Path
    report: Path
    headline: dict[str, Any]
    rows: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


def parquet_files_by_schema(root: Path) -> list[list[str]]:
    """The table's Parquet files (hidden temporaries skipped), grouped by file schema."""
    groups: dict[str, list[str]] = defaultdict(list)
    for found in sorted(root.rglob("*.parquet")):
        if any(part.startswith((".", "_")) for part in found.relative_to(root).parts):
            continue
        schema = pq.read_schema(found)
        groups[schema.remove_metadata().to_string()].append(str(found))
    return list(groups.values())


def read_table(spark: SparkSession, lake: str, table: str) -> DataFrame:
    """A lake table conformed to its schema; empty (with the schema) when it has no files.

    On a local lake, files are read in groups of one physical schema and each group is
    conformed on its own, so a lake written by other tools (nanosecond or naive timestamps,
    64-bit integers, all-null columns) still reads. event_date comes from the timestamps.
    """
    schema = schemas.TABLES[table]
    path = f"{lake.rstrip('/')}/{table}"
    if "://" in lake:
        return transforms.conform(spark.read.parquet(path), schema)
    groups = parquet_files_by_schema(Path(path))
    if not groups:
        return spark.createDataFrame([], schema)
    frames = [transforms.conform(spark.read.parquet(*files), schema) for files in groups]
    return reduce(DataFrame.unionByName, frames)


def _plain(value: Any) -> Any:
    return value.isoformat() if isinstance(value, date) else value


def collect(df: DataFrame) -> list[dict[str, Any]]:
    return [{k: _plain(v) for k, v in row.asDict().items()} for row in df.collect()]


def write_csv(path: Path, columns: Sequence[str], rows: list[dict[str, Any]]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(columns)
        for row in rows:
            writer.writerow(["" if row[c] is None else row[c] for c in columns])
    tmp.replace(path)


def audit_tables(spark: SparkSession, *, lake: str, start: date, end: date) -> dict[str, DataFrame]:
    """Every output table of the audit, as DataFrames (nothing is computed yet)."""
    events = transforms.with_event_date(read_table(spark, lake, "request_events"), "ts").cache()
    transactions = read_table(spark, lake, "transactions").cache()
    ledger = read_table(spark, lake, "ledger_entries")
    keys = transforms.key_facts(events).cache()
    suspects = transforms.suspected_double_charges(transactions).cache()
    violations = transforms.exactly_once_violations(transactions, ledger).cache()
    summary = transforms.daily_summary(
        events, keys, suspects, violations, start=start, end=end
    ).cache()
    return {
        "daily_summary": summary,
        "terminal_ranking": transforms.terminal_ranking(keys, start=start, end=end),
        "suspected_double_charges": transforms.in_range(suspects, start=start, end=end).orderBy(
            "event_date", "merchant_id", "second_transaction_id"
        ),
        "exactly_once_violations": transforms.in_range(violations, start=start, end=end).orderBy(
            "event_date", "merchant_id", "transaction_id"
        ),
        "network_rates": transforms.network_rates(events, keys, start=start, end=end),
        "daily_trend": transforms.daily_trend(summary),
    }


def run_audit(
    spark: SparkSession,
    *,
    lake: str,
    out: Path,
    start: date,
    end: date,
    on_stage: Callable[[str], None] = lambda _stage: None,
) -> AuditResult:
    if end < start:
        raise ValueError("--to is before --from")
    out.mkdir(parents=True, exist_ok=True)
    on_stage("reading the lake")
    tables = audit_tables(spark, lake=lake, start=start, end=end)
    rows: dict[str, list[dict[str, Any]]] = {}
    for name in OUTPUTS:
        on_stage(f"computing {name}")
        df = tables[name]
        rows[name] = collect(df)
        write_csv(out / f"{name}.csv", df.columns, rows[name])
        df.coalesce(1).write.mode("overwrite").parquet(str(out / name))
    on_stage("rendering report.html")
    audit = report.AuditData(start=start, end=end, **rows)
    html_path = out / "report.html"
    html_path.write_text(report.render(audit), encoding="utf-8")
    return AuditResult(out=out, report=html_path, headline=audit.headline(), rows=rows)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="idempay daily audit (SPEC §5)")
    parser.add_argument("--from", dest="start", type=date.fromisoformat, required=True)
    parser.add_argument("--to", dest="end", type=date.fromisoformat, required=True)
    parser.add_argument("--lake", required=True, help="lake root (request_events/, …)")
    parser.add_argument("--out", required=True, type=Path, help="output directory")
    parser.add_argument("--master", default=None, help="Spark master (default local[*])")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    spark = build_session(args.master)
    try:
        result = run_audit(spark, lake=args.lake, out=args.out, start=args.start, end=args.end)
    finally:
        spark.stop()
    for name, value in result.headline.items():
        sys.stdout.write(f"{name}: {value}\n")
    sys.stdout.write(f"report: {result.report}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
