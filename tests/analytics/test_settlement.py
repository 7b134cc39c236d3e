"""Settlement reconciliation against the acquirer's clearing (contract §5): a planted lake and
clearing files with every exception kind, each value computed by hand, by Spark and by the
DuckDB reference; the clearing landed through ``idempay lake add-clearing``.

The story, merchant mer_a unless said (amounts BRL minor units, refunds negative):

D1 (2026-11-20), clearing file D1:
- m1 approved 1250, cleared 1250                                → matched
- lost: our 0200's answer was lost (declined acquirer_timeout), the acquirer approved 4990
  and the reversal advice never reached it (row not reversed)    → acquirer_only (D1)
- unpaid: approved 1990, no clearing row                         → ours_only
- mismatch: approved 2500, cleared 2590                          → amount_mismatch
- dup: approved 990, two clearing rows of 990                    → matched + duplicate_rrn
- rev: approved then reversed by us (0400), row reversed         → nothing
- advice: declined acquirer_timeout, the 0420 advice reversed the authorization → nothing
- boundary: approved at the acquirer 23:59:59 (in D1's file), finished at ours 00:00:01 on
  D2                                                             → matched on D2
D2 (2026-11-21), clearing file D2:
- refund approved 500, cleared with processing code 20…          → matched, −500
- b1 (mer_b) approved 12900, cleared                             → matched
- declined (insufficient funds): no clearing row                 → nothing
D3 (2026-11-22): nofile approved, no clearing file landed        → not reconciled (a note)
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from typer.testing import CliRunner

from analytics import duckdb_reference
from analytics.jobs.daily_audit import audit_tables, collect, run_audit
from analytics.lake_health import LakeHealth
from analytics.metrics import EXCEPTION_COLUMNS, RECON_COLUMNS
from idempay_tools.cli import app
from tests.analytics.clearing_files import REFUND, add_clearing, d_row, write_clearing_file
from tests.analytics.lakes import D1, D2, D3, as_dicts, assert_rows_equal, ev, txn, write_lake

TRANSACTIONS = [
    txn("m1", "2026-11-20 10:00:00", rrn="MATCH0000001", authorization_code="A00001"),
    txn(
        "lost",
        "2026-11-20 11:00:00",
        amount=4990,
        status="declined",
        rrn="LOST00000001",
        decline_reason="acquirer_timeout",
    ),
    txn("unpaid", "2026-11-20 12:00:00", amount=1990, rrn="UNPAID000001"),
    txn("mismatch", "2026-11-20 13:00:00", amount=2500, rrn="MISMATCH0001"),
    txn("dup", "2026-11-20 14:00:00", amount=990, rrn="DUPLICATE001"),
    txn("rev", "2026-11-20 15:00:00", amount=7500, status="reversed", rrn="REVERSED0001"),
    txn(
        "advice",
        "2026-11-20 16:00:00",
        amount=3000,
        status="declined",
        rrn="ADVICE000001",
        decline_reason="acquirer_timeout",
    ),
    txn("boundary", "2026-11-21 00:00:01", amount=3490, rrn="MIDNIGHT0001"),
    txn("refund", "2026-11-21 09:00:00", amount=500, type_="refund", rrn="REFUND000001"),
    txn("b1", "2026-11-21 10:00:00", merchant="mer_b", amount=12900, rrn="MERB00000001"),
    txn(
        "declined",
        "2026-11-21 11:00:00",
        status="declined",
        rrn="DECLINED0001",
        decline_reason="insufficient_funds",
    ),
    txn("nofile", "2026-11-22 10:00:00", rrn="NOFILE000001"),
]
CLEARING_D1 = [
    d_row("MATCH0000001", "2026-11-20 09:59:59", 1250),
    d_row("LOST00000001", "2026-11-20 10:59:59", 4990),
    d_row("MISMATCH0001", "2026-11-20 12:59:59", 2590),
    d_row("DUPLICATE001", "2026-11-20 13:59:59", 990),
    d_row("DUPLICATE001", "2026-11-20 13:59:59", 990),
    d_row("REVERSED0001", "2026-11-20 14:59:59", 7500, reversed_at="2026-11-20 15:02:00"),
    d_row("ADVICE000001", "2026-11-20 15:59:59", 3000, reversed_at="2026-11-20 16:00:30"),
    d_row("MIDNIGHT0001", "2026-11-20 23:59:59", 3490),
]
CLEARING_D2 = [
    d_row("REFUND000001", "2026-11-21 08:59:59", 500, code=REFUND),
    d_row("MERB00000001", "2026-11-21 09:59:59", 12900, merchant="mer_b"),
]

EXPECTED_RECON = [
    # event_date, merchant, matched, matched_amount, acquirer_only, ours_only, mismatch, dup
    (D1, "mer_a", 2, 1250 + 990, 1, 1, 1, 1),
    (D1, "ALL", 2, 2240, 1, 1, 1, 1),
    (D2, "mer_a", 2, 3490 - 500, 0, 0, 0, 0),
    (D2, "mer_b", 1, 12900, 0, 0, 0, 0),
    (D2, "ALL", 3, 2990 + 12900, 0, 0, 0, 0),
]
EXPECTED_EXCEPTIONS = [
    (D1, "mer_a", "acquirer_only", "LOST00000001", "lost", 4990, "BRL", 4990),
    (D1, "mer_a", "amount_mismatch", "MISMATCH0001", "mismatch", 2500, "BRL", 2590),
    (D1, "mer_a", "duplicate_rrn", "DUPLICATE001", "dup", 990, "BRL", 1980),
    (D1, "mer_a", "ours_only", "UNPAID000001", "unpaid", 1990, "BRL", None),
]


def _events() -> list[dict[str, Any]]:
    return [
        ev(
            t["transaction_id"],
            t["created_at"].strftime("%Y-%m-%d %H:%M:%S"),
            "create",
            "created",
            merchant=t["merchant_id"],
            attempt=1,
        )
        for t in TRANSACTIONS
    ]


def planted_lake(root: Path, files: Path) -> Path:
    write_lake(root, "transactions", TRANSACTIONS)
    write_lake(root, "request_events", _events())
    write_lake(root, "ledger_entries", [])
    files.mkdir(exist_ok=True)
    for name, rows in (("d1.csv", CLEARING_D1), ("d2.csv", CLEARING_D2)):
        landed = add_clearing(write_clearing_file(files / name, rows), root)
        assert landed.exit_code == 0, landed.output
    return root


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("settlement")
    return planted_lake(work / "lake", work / "files")


@pytest.fixture(scope="module")
def audited(spark: SparkSession, lake: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The whole audit over D1..D3, once for the module (its tables, CSVs and report)."""
    return run_audit(spark, lake=str(lake), out=tmp_path_factory.mktemp("out"), start=D1, end=D3)


def test_every_exception_kind_by_hand_in_spark(audited: Any) -> None:
    assert_rows_equal(audited.rows["settlement_recon"], as_dicts(EXPECTED_RECON, RECON_COLUMNS))
    assert_rows_equal(
        audited.rows["settlement_exceptions"], as_dicts(EXPECTED_EXCEPTIONS, EXCEPTION_COLUMNS)
    )


def test_duckdb_reference_agrees_with_the_hand_computed_tables(lake: Path, audited: Any) -> None:
    answers = duckdb_reference.audit(lake, start=D1, end=D3, threads=1)
    assert_rows_equal(answers["settlement_recon"], as_dicts(EXPECTED_RECON, RECON_COLUMNS))
    assert_rows_equal(
        answers["settlement_exceptions"], as_dicts(EXPECTED_EXCEPTIONS, EXCEPTION_COLUMNS)
    )
    assert_rows_equal(answers["daily_summary"], audited.rows["daily_summary"])


def test_acquirer_timeouts_count_on_the_transactions_day(audited: Any) -> None:
    got = {
        (r["event_date"], r["merchant_id"]): (r["acquirer_timeouts"], r["acquirer_timeout_rate"])
        for r in audited.rows["daily_summary"]
    }
    # D1 mer_a: 7 transactions, 2 declined acquirer_timeout (lost, advice)
    assert got[(D1.isoformat(), "mer_a")] == (2, 2 / 7)
    assert got[(D1.isoformat(), "ALL")] == (2, 2 / 7)
    assert got[(D2.isoformat(), "mer_a")] == (0, 0.0)  # insufficient_funds is not one


def test_a_day_without_clearing_is_a_note_not_an_exception(audited: Any) -> None:
    assert [(n["kind"], n["event_date"]) for n in audited.notes] == [
        ("no_clearing", D3.isoformat())
    ]
    assert "1 approved transactions are not reconciled" in audited.notes[0]["detail"]
    assert audited.warnings == []


def test_outputs_and_the_report_lead_with_the_money(audited: Any) -> None:
    out = audited.out
    with (out / "settlement_exceptions.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [r["kind"] for r in rows] == [e[2] for e in EXPECTED_EXCEPTIONS]
    assert list(rows[0]) == EXCEPTION_COLUMNS
    with (out / "settlement_recon.csv").open() as handle:
        assert next(csv.reader(handle)) == RECON_COLUMNS
    assert (out / "settlement_recon" / "_SUCCESS").is_file()
    assert (out / "settlement_exceptions" / "_SUCCESS").is_file()
    html = audited.report.read_text()
    # the settlement banner comes before the headline cards
    assert html.index('id="settlement"') < html.index("<h2>Headline</h2>")
    for rrn in ("LOST00000001", "UNPAID000001", "MISMATCH0001", "DUPLICATE001"):
        assert rrn in html
    assert html.count('class="settlement-exception"') == 4
    assert 'id="settlement-chart"' in html
    assert audited.headline["settlement_exceptions"] == 4


def test_the_audit_command_strict_fails_on_exceptions(
    spark: SparkSession, lake: Path, tmp_path: Path
) -> None:
    args = ["audit", "--from", str(D1), "--to", str(D1), "--lake", str(lake)]
    args += ["--out", str(tmp_path / "out")]
    lenient = CliRunner().invoke(app, args)
    assert lenient.exit_code == 0, lenient.output
    assert "settlement exception [ours_only]" in lenient.output
    strict = CliRunner().invoke(app, [*args, "--strict"])
    assert strict.exit_code == 1, strict.output


def test_a_reconciled_range_passes_strict_and_ignores_days(
    spark: SparkSession, lake: Path, tmp_path: Path
) -> None:
    """D2 alone: every sale matched, the boundary sale among them although its clearing row
    is in D1's file."""
    result = run_audit(spark, lake=str(lake), out=tmp_path / "out", start=D2, end=D2)
    assert result.exceptions == []
    assert [r["matched"] for r in result.rows["settlement_recon"]] == [2, 1, 3]
    assert "Every sale matches the acquirer" in result.report.read_text()
    args = ["audit", "--from", str(D2), "--to", str(D2), "--lake", str(lake)]
    strict = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "cli"), "--strict"])
    assert strict.exit_code == 0, strict.output


def test_a_lake_without_clearing_reconciles_nothing(spark: SparkSession, tmp_path: Path) -> None:
    root = tmp_path / "lake"
    write_lake(root, "transactions", TRANSACTIONS[:1])
    write_lake(root, "request_events", _events()[:1])
    write_lake(root, "ledger_entries", [])
    health = LakeHealth()
    tables = audit_tables(spark, lake=str(root), start=D1, end=D1, health=health)
    assert collect(tables["settlement_recon"]) == []
    assert collect(tables["settlement_exceptions"]) == []
    assert health.notes == []  # no clearing at all: nothing to say per day
    answers = duckdb_reference.audit(root, start=D1, end=D1, threads=1)
    assert answers["settlement_recon"] == answers["settlement_exceptions"] == []
