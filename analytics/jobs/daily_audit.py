"""The daily audit job: read the lake → transforms → write the outputs (contract §5).

    spark-submit analytics/jobs/daily_audit.py --from 2026-11-01 --to 2026-11-07 \\
        --lake lake --out out [--master local[2]]

(or ``idempay audit`` with the same options). The whole lake is read, because a key's
metrics use all of its events whatever their date; only rows dated within --from..--to
(inclusive) are written. Outputs in --out: ``<table>.csv`` (one file with a header) and a
``<table>/`` Parquet folder for daily_summary, terminal_ranking, suspected_double_charges,
exactly_once_violations, network_rates, terminal_link_loss, daily_trend, offline_summary,
offline_terminals and duplicate_guard (``analytics.offline``), settlement_recon and
settlement_exceptions (``analytics.settlement``: the transactions against the acquirer's
clearing files in the lake), money_volume (``analytics.money``: approved, refunded and
reversed volume per currency, which the report leads with), plus ``report.html`` (the days
``analytics.synth`` made up marked: ``analytics.manifest.synthesized_days``),
``lake_warnings.csv`` (what is wrong with the lake: ``analytics.lake_health``) and
``lake_notes.csv`` (what is not damage but changes a figure's meaning: partitions older
than a lake schema's columns, days without a clearing file). With ``--strict`` any lake
warning or settlement exception makes the exit status 1.
CSV text cells that a spreadsheet would run as a formula are prefixed with ``'``.
"""

from __future__ import annotations

import argparse
import csv
import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import date
from functools import reduce
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file by spark-submit: make `analytics` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from pyspark.errors import AnalysisException  # noqa: E402
from pyspark.sql import DataFrame, Row, SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402
from pyspark.sql.pandas.types import to_arrow_schema  # noqa: E402
from pyspark.sql.types import StructType  # noqa: E402

from analytics import (  # noqa: E402
    clearing,
    lake_health,
    manifest,
    money,
    offline,
    outputs,
    report,
    schemas,
    settlement,
    transforms,
)
from analytics.lake import ADDED_COLUMNS  # noqa: E402
from analytics.lake_health import LakeHealth  # noqa: E402
from analytics.session import build_session  # noqa: E402

FORMULA_TRIGGERS = ("=", "+", "-", "@", "\t", "\r")
UNIQUE = {  # a row's identity in the database; a second copy in the lake is dropped
    "request_events": ["event_id"],
    "transactions": ["merchant_id", "transaction_id"],
    "ledger_entries": ["entry_id"],
}
OUTPUTS = [
    "money_volume",
    "daily_summary",
    "terminal_ranking",
    "suspected_double_charges",
    "exactly_once_violations",
    "network_rates",
    "terminal_link_loss",
    "daily_trend",
    "offline_summary",
    "offline_terminals",
    "duplicate_guard",
    "settlement_recon",
    "settlement_exceptions",
]


@dataclass
class AuditResult:
    out: Path
    report: Path
    headline: dict[str, Any]
    rows: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    warnings: list[dict[str, Any]] = field(default_factory=list)
    notes: list[dict[str, Any]] = field(default_factory=list)  # not damage: --strict ignores

    @property
    def exceptions(self) -> list[dict[str, Any]]:
        """The settlement exceptions (``--strict`` fails on any)."""
        return self.rows.get("settlement_exceptions", [])


def read_table(spark: SparkSession, lake: str, table: str, health: LakeHealth) -> DataFrame:
    """A lake table conformed to its schema, as read (a row copied into two files is there
    twice: each transform drops copies in the shuffle it does anyway); empty (with the
    schema) when it has no files.

    Only ``event_date=YYYY-MM-DD`` partitions are read (a stray ``event_date=D.bak/`` is
    reported, not read). On a local lake, files are read in groups of one physical schema
    and each group is conformed on its own, so a lake written by other tools (nanosecond or
    naive timestamps, 64-bit integers, all-null columns) still reads; manifests are checked
    and missing contract columns reported. event_date comes from the timestamps.
    """
    schema = schemas.TABLES[table]
    path = f"{lake.rstrip('/')}/{table}"
    if "://" in lake:  # files of two lake schemas: read the union of their columns
        files = spark.read.option("mergeSchema", "true").parquet(f"{path}/event_date=*-*-*")
        df = transforms.conform(files, schema)
    else:
        groups = lake_health.data_files(
            Path(path), table, schema.fieldNames(), health, added=ADDED_COLUMNS[table]
        )
        if not groups:
            return spark.createDataFrame([], schema)
        frames = [
            transforms.conform(spark.read.parquet(*files), schema) for files in groups.values()
        ]
        df = reduce(DataFrame.unionByName, frames)
    return df


def read_clearing(
    spark: SparkSession, lake: str, health: LakeHealth
) -> tuple[DataFrame, list[date]]:
    """The clearing rows with their ``clearing_date``, and the days that have a clearing
    file. On a local lake each day is checked first (manifest, and its rows against the
    trailer it was landed with): a day that disagrees is a warning and is not read at all."""
    schema = schemas.CLEARING
    root = f"{lake.rstrip('/')}/{clearing.TABLE}"
    if "://" in lake:
        pattern = f"{root}/{clearing.PARTITION}=*-*-*"
        try:
            files = spark.read.option("basePath", root).parquet(pattern)
        except AnalysisException:  # no clearing folder: nothing to reconcile
            return spark.createDataFrame([], schema).withColumn(
                "clearing_date", F.lit(None).cast("date")
            ), []
        rows = transforms.conform(files, schema).withColumn(
            "clearing_date", F.col("clearing_date").cast("date")
        )
        days = sorted(
            r["clearing_date"] for r in files.select("clearing_date").distinct().collect()
        )
        return rows, days
    good: list[tuple[date, Path]] = []
    for day, folder in clearing.partitions(Path(lake)):
        problems = clearing.verify(folder)
        for problem in problems:
            health.add("clearing", clearing.TABLE, day.isoformat(), f"{problem}: day not read")
        if not problems:
            good.append((day, folder))
    frames = [
        transforms.conform(spark.read.parquet(str(folder)), schema).withColumn(
            "clearing_date", F.lit(day)
        )
        for day, folder in good
    ]
    if not frames:
        empty = spark.createDataFrame([], schema)
        return empty.withColumn("clearing_date", F.lit(None).cast("date")), []
    return reduce(DataFrame.unionByName, frames), [day for day, _ in good]


def _clearing_notes(
    sold: DataFrame, days: list[date], health: LakeHealth, *, start: date, end: date
) -> None:
    """What the reconciliation could not cover, said: approved transactions of a day without
    a clearing file, and approved transactions without an rrn (older than lake schema 3)."""
    rows = (
        transforms.in_range(sold, start=start, end=end)
        .groupBy("event_date")
        .agg(F.sum("approved").alias("approved"), F.sum("approved_without_rrn").alias("bare"))
        .collect()
    )
    for row in sorted(rows, key=lambda r: r["event_date"]):
        day = row["event_date"].isoformat()
        if row["event_date"] not in days and row["approved"]:
            health.note(
                "no_clearing",
                clearing.TABLE,
                day,
                f"no clearing file landed for {day}: its {row['approved']} approved "
                "transactions are not reconciled (idempay lake add-clearing)",
            )
        elif row["bare"]:
            health.note(
                "not_reconcilable",
                "transactions",
                day,
                f"{row['bare']} approved transactions have no rrn (written before lake "
                "schema 3): not reconciled with the clearing file",
            )


def _report_duplicates(health: LakeHealth, table: str, *, read: int, unique: int) -> None:
    if read > unique:
        key = ", ".join(UNIQUE[table])
        health.add("duplicates", table, None, f"{read - unique} rows repeat a ({key}): dropped")


def _per_day(df: DataFrame, counted: Any, *, start: date, end: date) -> dict[str, int]:
    in_range = transforms.in_range(df, start=start, end=end)
    rows = in_range.groupBy("event_date").agg(counted.alias("n")).collect()
    return {row["event_date"].isoformat(): int(row["n"]) for row in rows}


def _total(df: DataFrame, *columns: str) -> list[int]:
    row = df.agg(*[F.sum(c) for c in columns]).collect()[0]
    return [int(value or 0) for value in row]


def _cubes(raw_events: DataFrame, health: LakeHealth) -> transforms.Cubes:
    """The events' small tables (``transforms.Cubes``): the key facts in one shuffle by key
    (copies dropped there), the event counts straight from the files; if those counted
    more events than the keys hold, the lake has copies: the event counts are redone, and
    the latencies done, from the events with copies dropped."""
    keys = transforms.key_cube(transforms.key_facts(transforms.events_by_key(raw_events)))
    keys = keys.cache()
    events = transforms.event_cube(raw_events).cache()
    [unique], [read] = _total(keys, "events"), _total(events, "events")
    _report_duplicates(health, "request_events", read=read, unique=unique)
    source = raw_events
    if read > unique:
        events.unpersist()
        source = transforms.drop_duplicate_rows(raw_events, [*transforms.KEY, "event_id"])
        events = transforms.event_cube(source).cache()
    return transforms.Cubes(
        keys=keys, events=events, latencies=transforms.create_latencies(source).cache()
    )


def _plain(value: Any) -> Any:
    return value.isoformat() if isinstance(value, date) else value


def collect(df: DataFrame) -> list[dict[str, Any]]:
    return [{k: _plain(v) for k, v in row.asDict().items()} for row in df.collect()]


def spreadsheet_safe(value: Any) -> Any:
    """A text cell a spreadsheet would run as a formula (it starts with = + - @, a tab or
    a carriage return: OWASP's CSV-injection rule) gets a leading ``'``, so it shows as the
    text it is. Numbers are left alone; the Parquet outputs keep every value as it is."""
    if isinstance(value, str) and value.startswith(FORMULA_TRIGGERS):
        return "'" + value
    return value


def write_csv(path: Path, columns: Sequence[str], rows: list[dict[str, Any]]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(columns)
        for row in rows:
            writer.writerow(["" if row[c] is None else spreadsheet_safe(row[c]) for c in columns])
    tmp.replace(path)


def write_parquet(folder: Path, schema: StructType, rows: list[Row]) -> None:
    """The collected rows as a Parquet folder (one file and ``_SUCCESS``, as Spark writes
    it), by the driver: no Spark job, and the query is not run again. Replaced whole."""
    arrow_schema = to_arrow_schema(schema, timezone="UTC")
    table = pa.Table.from_pylist([row.asDict() for row in rows], schema=arrow_schema)
    tmp = folder.with_name(f".{folder.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    pq.write_table(table, tmp / "part-00000.parquet")
    (tmp / "_SUCCESS").touch()
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)


def audit_tables(
    spark: SparkSession, *, lake: str, start: date, end: date, health: LakeHealth | None = None
) -> dict[str, DataFrame]:
    """Every output table of the audit, as DataFrames; what is wrong with the lake goes
    to ``health``."""
    health = health if health is not None else LakeHealth()
    raw_events = transforms.with_event_date(read_table(spark, lake, "request_events", health), "ts")
    cubes = _cubes(raw_events, health)
    transactions = read_table(spark, lake, "transactions", health)
    ledger = read_table(spark, lake, "ledger_entries", health)
    ledger_days = money.ledger_days(transactions, ledger).cache()
    unique, read, entries, entry_rows = _total(
        ledger_days, "transactions", "transaction_rows", "entries", "entry_rows"
    )
    _report_duplicates(health, "transactions", read=read, unique=unique)
    _report_duplicates(health, "ledger_entries", read=entry_rows, unique=entries)
    lake_health.days_without_events(
        _per_day(ledger_days, F.sum("transactions"), start=start, end=end),
        _per_day(cubes.events, F.sum("events"), start=start, end=end),
        health,
    )
    suspects = money.suspected_double_charges(transactions).cache()
    violations = money.violations_of(ledger_days, ledger).cache()
    sold = offline.transaction_cube(transactions).cache()
    summary = outputs.daily_summary(cubes, suspects, violations, sold, start=start, end=end).cache()
    cleared, clearing_days = read_clearing(spark, lake, health)
    if clearing_days:
        _clearing_notes(sold, clearing_days, health, start=start, end=end)
    found = settlement.outcomes(settlement.by_rrn(transactions, cleared), clearing_days).cache()
    return {
        "money_volume": money.money_volume(transactions, start=start, end=end),
        "daily_summary": summary,
        "terminal_ranking": outputs.terminal_ranking(cubes.keys, start=start, end=end),
        "suspected_double_charges": transforms.in_range(suspects, start=start, end=end).orderBy(
            "event_date", "merchant_id", "second_transaction_id"
        ),
        "exactly_once_violations": transforms.in_range(violations, start=start, end=end).orderBy(
            "event_date", "merchant_id", "transaction_id", "entry_id"
        ),
        "network_rates": outputs.network_rates(cubes, start=start, end=end),
        "terminal_link_loss": outputs.terminal_link_loss(cubes.keys, start=start, end=end),
        "daily_trend": outputs.daily_trend(summary),
        "offline_summary": offline.offline_summary(sold, start=start, end=end),
        "offline_terminals": offline.offline_terminals(sold, start=start, end=end),
        "duplicate_guard": offline.duplicate_guard(cubes.events, sold, start=start, end=end),
        "settlement_recon": settlement.settlement_recon(found, clearing_days, start=start, end=end),
        "settlement_exceptions": settlement.settlement_exceptions(found, start=start, end=end),
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
    health = LakeHealth()
    tables = audit_tables(spark, lake=lake, start=start, end=end, health=health)
    rows: dict[str, list[dict[str, Any]]] = {}
    for name in OUTPUTS:
        on_stage(f"computing {name}")
        df = tables[name]
        collected = df.collect()
        rows[name] = [{k: _plain(v) for k, v in row.asDict().items()} for row in collected]
        write_csv(out / f"{name}.csv", df.columns, rows[name])
        write_parquet(out / name, df.schema, collected)
    write_csv(out / "lake_warnings.csv", lake_health.COLUMNS, health.warnings)
    write_csv(out / "lake_notes.csv", lake_health.COLUMNS, health.notes)
    on_stage("rendering report.html")
    synthesized = [day.isoformat() for day in manifest.synthesized_days(lake)]
    audit = report.AuditData(
        start=start,
        end=end,
        lake_warnings=health.warnings,
        lake_notes=health.notes,
        synthesized_days=synthesized,
        **rows,
    )
    html_path = out / "report.html"
    html_path.write_text(report.render(audit), encoding="utf-8")
    return AuditResult(
        out=out,
        report=html_path,
        headline=audit.headline(),
        rows=rows,
        warnings=health.warnings,
        notes=health.notes,
    )


def describe(warning: dict[str, Any], *, what: str = "lake warning") -> str:
    where = f"{warning['table']}/event_date={warning['event_date']}"
    return f"{what} [{warning['kind']}] {where}: {warning['detail']}"


def describe_exception(row: dict[str, Any]) -> str:
    return (
        f"settlement exception [{row['kind']}] {row['event_date']} merchant {row['merchant_id']}"
        f" rrn {row['rrn']} transaction {row['transaction_id'] or '-'}: amount "
        f"{_or_dash(row['amount'])} {row['currency'] or ''}, "
        f"clearing {_or_dash(row['clearing_amount'])}"
    )


def _or_dash(value: Any) -> str:
    return "-" if value is None else str(value)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="idempay daily audit (contract §5)")
    parser.add_argument("--from", dest="start", type=date.fromisoformat, required=True)
    parser.add_argument("--to", dest="end", type=date.fromisoformat, required=True)
    parser.add_argument("--lake", required=True, help="lake root (request_events/, …)")
    parser.add_argument("--out", required=True, type=Path, help="output directory")
    parser.add_argument("--master", default=None, help="Spark master (default local[*])")
    parser.add_argument(
        "--strict",
        action="store_true",
        help="exit 1 when the lake has any warning or the settlement any exception",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    spark = build_session(args.master)
    try:
        result = run_audit(spark, lake=args.lake, out=args.out, start=args.start, end=args.end)
    finally:
        spark.stop()
    for warning in result.warnings:
        sys.stdout.write(describe(warning) + "\n")
    for note in result.notes:
        sys.stdout.write(describe(note, what="lake note") + "\n")
    for name, value in result.headline.items():
        sys.stdout.write(f"{name}: {value}\n")
    for exception in result.exceptions:
        sys.stdout.write(describe_exception(exception) + "\n")
    sys.stdout.write(f"report: {result.report}\n")
    return 1 if args.strict and (result.warnings or result.exceptions) else 0


if __name__ == "__main__":
    sys.exit(main())
