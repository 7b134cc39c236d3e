"""The daily audit end to end: a synthesized lake, the job under spark-submit with the
CronJob's arguments, and ``idempay audit`` in-process giving the same answer."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from datetime import date
from pathlib import Path

import pyarrow.parquet as pq
import pyspark
import pytest
from pyspark.sql import SparkSession
from typer.testing import CliRunner

from analytics.synth import SynthConfig, SynthResult, synthesize
from idempay_tools.cli import app
from tests.analytics.conftest import SHORT_LIVED_JVM

ROOT = Path(__file__).resolve().parents[2]
FIRST, LAST = date(2026, 11, 20), date(2026, 11, 21)
HEADERS = {
    "daily_summary.csv": (
        "event_date,merchant_id,transactions,create_requests,retried_transactions,retry_rate,"
        "unseen_attempts,link_loss_rate,duplicate_requests,duplicate_rate,in_doubt_transactions,in_doubt_rate,"
        "lookup_found_rate,in_doubt_resolution_p50_s,in_doubt_resolution_p95_s,key_reused,"
        "aborted,expired,reversed,acquirer_timeouts,acquirer_timeout_rate,"
        "suspected_double_charges,exactly_once_violations,"
        "create_p50_ms,create_p95_ms,create_p99_ms"
    ),
    "settlement_recon.csv": (
        "event_date,merchant_id,matched,matched_amount,acquirer_only,ours_only,"
        "amount_mismatch,duplicate_rrn"
    ),
    "settlement_exceptions.csv": (
        "event_date,merchant_id,kind,rrn,transaction_id,amount,currency,clearing_amount"
    ),
    "terminal_ranking.csv": (
        "event_date,merchant_id,terminal_id,transactions,retried_transactions,retry_rate,rank"
    ),
    "network_rates.csv": (
        "event_date,network,transactions,create_requests,retried_transactions,retry_rate,"
        "duplicate_requests,duplicate_rate,in_doubt_transactions,in_doubt_rate,"
        "lookup_found_rate,unseen_attempts,link_loss_rate"
    ),
    "suspected_double_charges.csv": (
        "event_date,merchant_id,terminal_id,card_fingerprint,amount,currency,"
        "first_transaction_id,second_transaction_id,seconds_apart"
    ),
    "offline_summary.csv": (
        "event_date,merchant_id,currency,transactions,offline_transactions,offline_rate,"
        "forward_delay_p50_s,forward_delay_p95_s,forward_delay_max_s,offline_declined,"
        "offline_decline_rate,offline_amount_at_risk,forwarded_after_day_end"
    ),
    "duplicate_guard.csv": "event_date,merchant_id,duplicates_blocked,duplicates_overridden",
}


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, SynthResult]:
    root = tmp_path_factory.mktemp("lake")
    config = SynthConfig(
        lake=root, days=3, events_per_day=1500, seed=12, start=FIRST, merchants=3, violations=1
    )  # a seed with new-key double charges on each day, the one past the range included
    return root, synthesize(config)


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def _spark_submit(lake: Path, out: Path, tmp: Path) -> subprocess.CompletedProcess[str]:
    conf = tmp / "spark-conf"  # test-only defaults, so the command line is the CronJob's
    conf.mkdir()
    (conf / "spark-defaults.conf").write_text(
        "spark.ui.enabled false\nspark.driver.host 127.0.0.1\n"
        "spark.driver.bindAddress 127.0.0.1\n"
        f"spark.driver.extraJavaOptions {SHORT_LIVED_JVM}\n"
    )
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_CONF_DIR": str(conf),
    }
    spark_submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    command = [
        str(spark_submit),
        "--master",
        "local[2]",
        "analytics/jobs/daily_audit.py",
        "--from",
        FIRST.isoformat(),
        "--to",
        LAST.isoformat(),
        "--lake",
        str(lake),
        "--out",
        str(out),
    ]
    return subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False
    )


def test_synthesized_lake_has_the_contract_columns(lake: tuple[Path, SynthResult]) -> None:
    root, result = lake
    names = {
        "request_events": "event_id ts merchant_id terminal_id idempotency_key endpoint "
        "outcome http_status attempt network latency_ms",
        "transactions": "transaction_id merchant_id terminal_id type amount currency "
        "card_fingerprint status created_at processed_at reversed_at "
        "offline captured_at duplicate_override "  # lake schema 2
        "rrn authorization_code decline_reason",  # lake schema 3
        "ledger_entries": "entry_id transaction_id merchant_id amount currency kind created_at",
    }
    for table, columns in names.items():
        schema = pq.read_schema(root / table / f"event_date={FIRST}" / "part-0.parquet")
        assert schema.names == columns.split()
    assert result.events >= 3 * 1500
    assert result.planted_double_charges, "the seed should plant new-key double charges"


def test_daily_audit_under_spark_submit_and_the_cli_agree(
    lake: tuple[Path, SynthResult], tmp_path: Path, spark: SparkSession
) -> None:
    root, result = lake
    out = tmp_path / "submit"
    done = _spark_submit(root, out, tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    assert f"report: {out / 'report.html'}" in done.stdout

    for name, header in HEADERS.items():
        assert (out / name).read_text().splitlines()[0] == header, name
    summary = _rows(out / "daily_summary.csv")
    assert pq.read_table(out / "daily_summary").num_rows == len(summary)
    # the synthesized clearing: every sale matched, no exception
    recon = [r for r in _rows(out / "settlement_recon.csv") if r["merchant_id"] == "ALL"]
    assert recon and all(int(r["matched"]) > 0 for r in recon)
    assert _rows(out / "settlement_exceptions.csv") == []
    for folder in (
        "terminal_ranking",
        "suspected_double_charges",
        "exactly_once_violations",
        "offline_summary",
        "offline_terminals",
        "duplicate_guard",
    ):
        assert (out / folder).is_dir()

    # Only the range, three merchants and the fleet row per day.
    assert sorted({r["event_date"] for r in summary}) == [FIRST.isoformat(), LAST.isoformat()]
    fleet = [r for r in summary if r["merchant_id"] == "ALL"]
    assert len(fleet) == 2 and len(summary) == 2 * 4
    for day in fleet:
        merchants = [r for r in summary if r["event_date"] == day["event_date"]][:-1]
        assert int(day["transactions"]) == sum(int(r["transactions"]) for r in merchants)

    # The planted new-key double charges dated in the range, and nothing else.
    planted = {(d.isoformat(), a, b) for d, a, b in result.planted_double_charges if d <= LAST}
    suspects = _rows(out / "suspected_double_charges.csv")
    found = {
        (r["event_date"], r["first_transaction_id"], r["second_transaction_id"]) for r in suspects
    }
    assert found == planted and planted
    assert any(d > LAST for d, _, _ in result.planted_double_charges)  # out of range: absent
    assert sum(int(r["suspected_double_charges"]) for r in fleet) == len(planted)

    # The one planted exactly-once violation (day one), named in the report.
    violations = _rows(out / "exactly_once_violations.csv")
    assert [(v["event_date"], v["violation"]) for v in violations] == [
        (FIRST.isoformat(), "duplicate_charge")
    ]
    report = (out / "report.html").read_text()
    assert violations[0]["transaction_id"] in report
    ranks = [r for r in _rows(out / "terminal_ranking.csv") if r["event_date"] == FIRST.isoformat()]
    assert {r["rank"] for r in ranks if r["merchant_id"] == ranks[0]["merchant_id"]} >= {"1"}

    # `idempay audit` (in-process, on the suite's session) writes the same summary.
    cli_out = tmp_path / "cli"
    outcome = CliRunner().invoke(
        app,
        [
            "audit",
            "--from",
            str(FIRST),
            "--to",
            str(LAST),
            "--lake",
            str(root),
            "--out",
            str(cli_out),
        ],
    )
    assert outcome.exit_code == 0, outcome.output
    assert "exactly_once_violations" in outcome.output and "report:" in outcome.output
    assert (cli_out / "daily_summary.csv").read_text() == (out / "daily_summary.csv").read_text()
