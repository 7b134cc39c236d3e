"""Lake schema 2 is additive (issues 16, 17): a transactions partition written before the
offline columns existed (schema 1, its manifest included) is still the contract — read
with them null, counted as not offline, said in a note, never a warning, so ``--strict``
passes — and the export can merge with it."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession
from typer.testing import CliRunner

from analytics import duckdb_reference, manifest
from analytics.jobs.daily_audit import run_audit
from analytics.lake import ADDED_COLUMNS, TABLES, read_partition, required_columns
from idempay_tools.cli import app
from tests.analytics.lakes import D1, D2, entry, ev, txn, write_lake

OLD_COLUMNS = [
    "transaction_id",
    "merchant_id",
    "terminal_id",
    "type",
    "amount",
    "currency",
    "card_fingerprint",
    "status",
    "created_at",
    "processed_at",
    "reversed_at",
]


def _schema_1_partition(lake: Path, rows: list[dict[str, object]]) -> Path:
    """D1's transactions as the exporter wrote them before lake schema 2: the contract's
    eleven columns and a version-1 manifest."""
    folder = lake / "transactions" / f"event_date={D1}"
    folder.mkdir(parents=True)
    table = pa.Table.from_pylist(rows, schema=TABLES["transactions"]).select(OLD_COLUMNS)
    pq.write_table(table, folder / "part-0.parquet")
    body = json.loads(
        manifest.render(
            "transactions",
            D1,
            OLD_COLUMNS,
            [manifest.describe(folder / "part-0.parquet", table.num_rows)],
        )
    )
    body["schema_version"] = 1
    (folder / manifest.MANIFEST).write_text(json.dumps(body))
    (folder / manifest.SUCCESS).touch()
    return folder


@pytest.fixture
def lake(tmp_path: Path) -> Path:
    root = tmp_path / "lake"
    old = [txn("k1", "2026-11-20 10:00:00", card="fp-1"), txn("k2", "2026-11-20 10:01:00")]
    _schema_1_partition(root, old)
    write_lake(  # D2 in schema 2: one offline advice, one override
        root,
        "transactions",
        [
            txn("k3", "2026-11-21 10:00:00", offline=True, captured="2026-11-21 09:00:00"),
            txn("k4", "2026-11-21 11:00:00", card="fp-4", override=True),
        ],
    )
    events = [
        ev(k, m, "create", "created", attempt=1)
        for k, m in [
            ("k1", "2026-11-20 10:00:00"),
            ("k2", "2026-11-20 10:01:00"),
            ("k3", "2026-11-21 10:00:00"),
            ("k4", "2026-11-21 11:00:00"),
        ]
    ]
    write_lake(root, "request_events", events)
    write_lake(root, "ledger_entries", [entry("e1", "k1", "2026-11-20 10:00:00")])
    return root


def test_the_contract_columns_are_lake_schema_1() -> None:
    assert required_columns("transactions") == OLD_COLUMNS
    assert TABLES["transactions"].names == [*OLD_COLUMNS, *ADDED_COLUMNS["transactions"]]
    assert [str(TABLES["transactions"].field(c).type) for c in ADDED_COLUMNS["transactions"]] == [
        "bool",
        "timestamp[us, tz=UTC]",
        "bool",
        "string",  # lake schema 3: rrn, authorization_code, decline_reason
        "string",
        "string",
    ]


def test_a_schema_1_partition_is_intact_and_merges_with_nulls(lake: Path) -> None:
    folder = lake / "transactions" / f"event_date={D1}"
    names = TABLES["transactions"].names
    assert manifest.problems(folder, columns=names, added=ADDED_COLUMNS["transactions"]) == []
    # the same manifest, had it claimed version 2 with eleven columns, is not intact
    assert manifest.problems(folder, columns=names) != []
    held = read_partition(lake, "transactions", D1)
    assert held is not None and held.schema == TABLES["transactions"]
    assert held.column("offline").to_pylist() == [None, None]
    assert held.column("duplicate_override").null_count == 2


def test_the_audit_reads_it_as_not_offline_with_a_note_and_strict_passes(
    spark: SparkSession, lake: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    result = run_audit(spark, lake=str(lake), out=out, start=D1, end=D2)

    assert result.warnings == []
    assert [(n["kind"], n["table"], n["event_date"]) for n in result.notes] == [
        ("older_schema", "transactions", D1.isoformat())
    ]
    assert "offline, captured_at, duplicate_override" in result.notes[0]["detail"]
    fleet = {
        r["event_date"]: (r["transactions"], r["offline_transactions"])
        for r in result.rows["offline_summary"]
        if r["merchant_id"] == "ALL"
    }
    assert fleet == {D1.isoformat(): (2, 0), D2.isoformat(): (2, 1)}
    guard = [(r["event_date"], r["duplicates_overridden"]) for r in result.rows["duplicate_guard"]]
    assert guard == [(D1.isoformat(), 0), (D2.isoformat(), 1), (D2.isoformat(), 1)]
    with (out / "lake_notes.csv").open(newline="") as handle:
        assert [row["kind"] for row in csv.DictReader(handle)] == ["older_schema"]
    assert (out / "lake_warnings.csv").read_text().splitlines() == ["kind,table,event_date,detail"]
    html = (out / "report.html").read_text()
    assert 'id="lake-notes"' in html and 'id="lake-warnings"' not in html

    strict = CliRunner().invoke(
        app,
        ["audit", "--from", str(D1), "--to", str(D2), "--lake", str(lake)]
        + ["--out", str(tmp_path / "cli"), "--strict"],
    )
    assert strict.exit_code == 0, strict.output

    answers = duckdb_reference.audit(lake, start=D1, end=D2, threads=1)
    assert answers["offline_summary"] == result.rows["offline_summary"]
    assert answers["duplicate_guard"] == result.rows["duplicate_guard"]


def test_duckdb_reads_a_lake_written_entirely_before_schema_2(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    _schema_1_partition(lake, [txn("k1", "2026-11-20 10:00:00")])
    write_lake(lake, "request_events", [ev("k1", "2026-11-20 10:00:00", "create", "created")])
    write_lake(lake, "ledger_entries", [])
    answers = duckdb_reference.audit(lake, start=D1, end=D1, threads=1)
    assert [(r["merchant_id"], r["transactions"], r["offline_transactions"]) for r in
            answers["offline_summary"]] == [("mer_a", 1, 0), ("ALL", 1, 0)]  # fmt: skip
    assert [(r["merchant_id"], r["duplicates_overridden"]) for r in answers["duplicate_guard"]] == [
        ("ALL", 0)
    ]
