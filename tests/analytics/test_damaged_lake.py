"""The audit on a damaged lake (issue 22, item 6) and its CSVs in a spreadsheet (issue 23,
item 6). Before, a stray ``event_date=D.bak/`` copy was read too (creates doubled), an empty
events partition or a file without ``network`` passed without a word, and exit was 0."""

from __future__ import annotations

import csv
import shutil
from datetime import date
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import SparkSession
from typer.testing import CliRunner

from analytics.jobs.daily_audit import run_audit
from analytics.lake import TABLES, write_partition
from idempay_tools.cli import app
from tests.analytics.lakes import D1, D2, entry, ev, txn, write_lake

FORMULA_TRIGGERS = ("=", "+", "-", "@", "\t", "\r")


def _healthy_day(lake: Path) -> None:
    """D1: three keys, each created once and charged once."""
    write_lake(
        lake,
        "request_events",
        [ev(f"k{i}", f"2026-11-20 10:00:0{i}", "create", "created", attempt=1) for i in (1, 2, 3)],
    )
    write_lake(
        lake,
        "transactions",
        [txn(f"k{i}", f"2026-11-20 10:00:0{i}", card=f"fp-{i}") for i in (1, 2, 3)],
    )
    write_lake(
        lake,
        "ledger_entries",
        [entry(f"le-{i}", f"k{i}", f"2026-11-20 10:00:0{i}") for i in (1, 2, 3)],
    )


def _audit(spark: SparkSession, lake: Path, out: Path) -> Any:
    return run_audit(spark, lake=str(lake), out=out, start=D1, end=D2)


def _fleet(result: Any, day: date) -> dict[str, Any]:
    rows = result.rows["daily_summary"]
    return next(r for r in rows if r["event_date"] == day.isoformat() and r["merchant_id"] == "ALL")


def _kinds(result: Any) -> set[tuple[str, str, str | None]]:
    return {(w["kind"], w["table"], w["event_date"]) for w in result.warnings}


def test_a_stray_copy_and_duplicate_rows_are_not_counted_and_are_reported(
    spark: SparkSession, tmp_path: Path
) -> None:
    lake = tmp_path / "lake"
    _healthy_day(lake)
    events = lake / "request_events"
    shutil.copytree(events / f"event_date={D1}", events / f"event_date={D1}.bak")
    again = pq.read_table(events / f"event_date={D1}" / "part-0.parquet").slice(0, 1)
    write_partition(lake, "request_events", D2, [again])  # one event copied into D2's folder

    result = _audit(spark, lake, tmp_path / "out")

    day = _fleet(result, D1)
    assert (day["transactions"], day["create_requests"], day["retried_transactions"]) == (3, 3, 0)
    assert day["retry_rate"] == 0.0
    assert ("ignored_path", "request_events", None) in _kinds(result)
    assert ("duplicates", "request_events", None) in _kinds(result)
    assert f"event_date={D1}.bak" in " ".join(w["detail"] for w in result.warnings)


def test_a_day_with_transactions_but_no_events_is_flagged_everywhere_and_fails_strict(
    spark: SparkSession, tmp_path: Path
) -> None:
    lake = tmp_path / "lake"
    _healthy_day(lake)
    write_partition(lake, "request_events", D2, [])  # exported empty, or emptied
    write_lake(
        lake,
        "transactions",
        [txn("k8", "2026-11-21 09:00:00"), txn("k9", "2026-11-21 09:01:00")],  # same card
    )
    out = tmp_path / "out"
    result = _audit(spark, lake, out)

    assert ("no_events", "request_events", D2.isoformat()) in _kinds(result)
    assert _fleet(result, D2)["suspected_double_charges"] == 1
    with (out / "lake_warnings.csv").open(newline="") as handle:
        written = list(csv.DictReader(handle))
    assert {(w["kind"], w["event_date"]) for w in written} == {("no_events", D2.isoformat())}
    html = (out / "report.html").read_text()
    assert 'id="lake-warnings"' in html
    assert html.index('id="lake-warnings"') < html.index('id="exactly-once"')
    assert "2 transactions but no request events" in html

    strict = CliRunner().invoke(
        app,
        ["audit", "--from", str(D1), "--to", str(D2), "--lake", str(lake)]
        + ["--out", str(tmp_path / "cli"), "--strict"],
    )
    assert strict.exit_code == 1, strict.output
    assert "no_events" in strict.output and "no request events" in strict.output
    relaxed = CliRunner().invoke(
        app,
        ["audit", "--from", str(D1), "--to", str(D2), "--lake", str(lake)]
        + ["--out", str(tmp_path / "cli2")],
    )
    assert relaxed.exit_code == 0, relaxed.output


def test_an_old_schema_partition_without_manifest_is_reported(
    spark: SparkSession, tmp_path: Path
) -> None:
    lake = tmp_path / "lake"
    _healthy_day(lake)
    old = [ev("k7", "2026-11-21 08:00:00", "create", "created", attempt=1)]
    table = pa.Table.from_pylist(old, schema=TABLES["request_events"]).drop_columns(["network"])
    folder = lake / "request_events" / f"event_date={D2}"
    folder.mkdir(parents=True)
    pq.write_table(table, folder / "part-0.parquet")

    result = _audit(spark, lake, tmp_path / "out")

    kinds = _kinds(result)
    assert ("missing_column", "request_events", D2.isoformat()) in kinds
    assert ("manifest", "request_events", D2.isoformat()) in kinds
    details = " ".join(w["detail"] for w in result.warnings)
    assert "lacks network" in details and "manifest missing" in details
    assert {w["event_date"] for w in result.warnings} == {D2.isoformat()}  # D1 is intact


def test_finance_csvs_never_hold_a_formula(spark: SparkSession, tmp_path: Path) -> None:
    """``-1-1`` as a terminal id showed as −2 in a spreadsheet. Read the CSVs as a
    spreadsheet does: a text cell starting with = + - @, tab or CR is a formula."""
    lake = tmp_path / "lake"
    terminals = ["-1-1", "=1+1", "@SUM(A1)", "+1"]
    moments = ["10:00:00", "10:00:30", "10:05:00", "10:05:30"]
    write_lake(
        lake,
        "request_events",
        [
            ev(f"k{i}", f"2026-11-20 {m}", "create", "created", terminal=t, attempt=2)
            for i, (t, m) in enumerate(zip(terminals, moments, strict=True))
        ],
    )
    write_lake(
        lake,
        "transactions",
        [txn(f"k{i}", f"2026-11-20 {m}", terminal="-1-1") for i, m in enumerate(moments[:2])],
    )
    out = tmp_path / "out"
    _audit(spark, lake, out)

    for name in ("terminal_ranking.csv", "suspected_double_charges.csv", "daily_summary.csv"):
        with (out / name).open(newline="") as handle:
            rows = list(csv.reader(handle))
        assert len(rows) > 1, name
        for row in rows[1:]:
            for cell in row:
                assert _is_number(cell) or not cell.startswith(FORMULA_TRIGGERS), (name, cell)
    with (out / "terminal_ranking.csv").open(newline="") as handle:
        shown = {r["terminal_id"] for r in csv.DictReader(handle)}
    assert {"'-1-1", "'=1+1", "'@SUM(A1)", "'+1"} <= shown
    with (out / "suspected_double_charges.csv").open(newline="") as handle:
        assert [r["terminal_id"] for r in csv.DictReader(handle)] == ["'-1-1"]
    assert pq.read_table(out / "terminal_ranking").column("terminal_id").to_pylist().count("-1-1")


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True
