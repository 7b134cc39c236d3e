"""``idempay lake add-clearing``: a clearing file is landed only when its trailer agrees with
its rows, once (the same file again changes nothing; another file for the day only with
``--replace``); a landed day that no longer agrees with its trailer is not read by the audit;
a transactions partition older than lake schema 3 is read, its sales said not reconcilable,
never dropped nor called unpaid."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import SparkSession

from analytics import clearing, duckdb_reference, manifest
from analytics.jobs.daily_audit import run_audit
from analytics.lake import TABLES
from tests.analytics.clearing_files import add_clearing, d_row, write_clearing_file
from tests.analytics.lakes import D1, D2, ev, txn, write_lake

ROWS = [
    d_row("RRN000000001", "2026-11-20 10:00:00", 1250),
    d_row("RRN000000002", "2026-11-20 11:00:00", 990, reversed_at="2026-11-20 11:01:00"),
]


def _landed_rows(lake: Path) -> list[tuple[str, int]]:
    table = pq.read_table(clearing.partition_dir(lake, D1) / "part-0.parquet")
    return [(r["rrn"], r["amount"]) for r in table.to_pylist()]


def test_a_file_whose_trailer_disagrees_is_refused_and_nothing_lands(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    lying = write_clearing_file(tmp_path / "net.csv", ROWS, net=2240)  # 990 was reversed
    result = add_clearing(lying, lake)
    assert result.exit_code == 1
    assert "trailer says net amount 2240, the records sum to 1250" in result.output
    assert "nothing landed" in result.output
    short = write_clearing_file(tmp_path / "count.csv", ROWS, count=3)
    assert "trailer says 3 records" in add_clearing(short, lake).output
    truncated = tmp_path / "cut.csv"
    truncated.write_text("\n".join(lying.read_text().splitlines()[:-1]) + "\n")
    assert "no trailer" in add_clearing(truncated, lake).output
    assert not (lake / "clearing").exists()


def test_landing_is_idempotent_and_another_file_needs_replace(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    first = write_clearing_file(tmp_path / "a.csv", ROWS)
    assert add_clearing(first, lake).exit_code == 0
    landed = clearing.partition_dir(lake, D1)
    before = (landed / manifest.MANIFEST).read_text(), (landed / "part-0.parquet").read_bytes()
    again = add_clearing(first, lake)
    assert again.exit_code == 0 and "already landed, unchanged" in again.output
    after = (landed / manifest.MANIFEST).read_text(), (landed / "part-0.parquet").read_bytes()
    assert after == before

    other = write_clearing_file(tmp_path / "b.csv", [*ROWS, d_row("RRN3", "2026-11-20 12:00", 5)])
    refused = add_clearing(other, lake)
    assert refused.exit_code == 1 and "already landed for 2026-11-20" in refused.output
    assert _landed_rows(lake) == [("RRN000000001", 1250), ("RRN000000002", 990)]
    replaced = add_clearing(other, lake, "--replace")
    assert replaced.exit_code == 0, replaced.output
    assert [rrn for rrn, _ in _landed_rows(lake)] == ["RRN000000001", "RRN000000002", "RRN3"]
    body = json.loads((landed / manifest.MANIFEST).read_text())
    assert (body["record_count"], body["net_amount"], body["source_name"]) == (3, 1255, "b.csv")


def test_the_day_comes_from_the_rows_or_is_stated(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    two_days = [*ROWS, d_row("RRN3", "2026-11-21 00:00:00", 5)]
    spans = add_clearing(write_clearing_file(tmp_path / "two.csv", two_days), lake)
    assert spans.exit_code == 1 and "more than one day" in spans.output
    empty = write_clearing_file(tmp_path / "empty.csv", [])
    assert "give --date" in add_clearing(empty, lake).output
    assert add_clearing(empty, lake, "--date", str(D2)).exit_code == 0
    assert pq.read_table(clearing.partition_dir(lake, D2) / "part-0.parquet").num_rows == 0
    wrong = add_clearing(write_clearing_file(tmp_path / "d1.csv", ROWS), lake, "--date", str(D2))
    assert wrong.exit_code == 1 and "not on 2026-11-21" in wrong.output


def _tamper(lake: Path) -> None:
    """Rewrite D1's landed rows (1250 → 1) with a manifest that vouches for the new file:
    only the trailer it was landed with can tell."""
    folder = clearing.partition_dir(lake, D1)
    rows = pq.read_table(folder / "part-0.parquet")
    rows = rows.set_column(5, "amount", pa.array([1, 990], pa.int64()))
    pq.write_table(rows, folder / "part-0.parquet")
    body = json.loads((folder / manifest.MANIFEST).read_text())
    body["files"][0]["sha256"] = manifest.sha256_of(folder / "part-0.parquet")
    (folder / manifest.MANIFEST).write_text(json.dumps(body))


def _schema_2_partition(lake: Path) -> None:
    """D2's transactions as the exporter wrote them before lake schema 3 (no rrn)."""
    folder = lake / "transactions" / f"event_date={D2}"
    folder.mkdir(parents=True)
    names = [n for n in TABLES["transactions"].names if manifest.ADDED_IN.get(n, 1) <= 2]
    row = txn("old", "2026-11-21 10:00:00", amount=700)
    table = pa.Table.from_pylist([row], schema=TABLES["transactions"]).select(names)
    pq.write_table(table, folder / "part-0.parquet")
    entry = manifest.describe(folder / "part-0.parquet", 1)
    body = json.loads(manifest.render("transactions", D2, names, [entry]))
    body["schema_version"] = 2
    (folder / manifest.MANIFEST).write_text(json.dumps(body))
    (folder / manifest.SUCCESS).touch()


def test_a_tampered_day_is_not_read_and_an_older_partition_is_not_reconcilable(
    spark: SparkSession, tmp_path: Path
) -> None:
    lake = tmp_path / "lake"
    write_lake(lake, "transactions", [txn("new", "2026-11-20 10:00:00", rrn="RRN000000001")])
    _schema_2_partition(lake)
    write_lake(
        lake,
        "request_events",
        [
            ev("new", "2026-11-20 10:00:00", "create", "created"),
            ev("old", "2026-11-21 10:00:00", "create", "created"),
        ],
    )
    write_lake(lake, "ledger_entries", [])
    assert add_clearing(write_clearing_file(tmp_path / "d1.csv", ROWS), lake).exit_code == 0
    empty = write_clearing_file(tmp_path / "d2.csv", [])
    assert add_clearing(empty, lake, "--date", str(D2)).exit_code == 0
    _tamper(lake)
    assert clearing.verify(clearing.partition_dir(lake, D1)) == [
        "rows disagree with the landed trailer: trailer says net amount 1250, the rows sum to 1"
    ]

    result = run_audit(spark, lake=str(lake), out=tmp_path / "out", start=D1, end=D2)

    assert [(w["kind"], w["event_date"]) for w in result.warnings] == [("clearing", str(D1))]
    kinds = [(n["kind"], n["table"], n["event_date"]) for n in result.notes]
    assert kinds == [
        ("older_schema", "transactions", str(D2)),
        ("no_clearing", "clearing", str(D1)),  # D1's file was refused: nothing reconciled
        ("not_reconcilable", "transactions", str(D2)),
    ]
    assert "predates rrn, authorization_code, decline_reason" in result.notes[0]["detail"]
    # the old sale is counted (a transaction, no exception), never an unpaid sale
    assert result.exceptions == []
    assert [(r["event_date"], r["merchant_id"], r["matched"]) for r in
            result.rows["settlement_recon"]] == [(str(D2), "ALL", 0)]  # fmt: skip
    fleet = [r for r in result.rows["daily_summary"] if r["merchant_id"] == "ALL"]
    assert [r["transactions"] for r in fleet] == [1, 1]
    answers = duckdb_reference.audit(lake, start=D1, end=D2, threads=1)
    assert answers["settlement_recon"] == result.rows["settlement_recon"]
    assert answers["settlement_exceptions"] == []
