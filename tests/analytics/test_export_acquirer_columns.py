"""``idempay export`` writes lake schema 3's transaction columns from the database — ``rrn``,
``authorization_code``, ``decline_reason`` — so the audit can reconcile the day with the
acquirer's clearing file and count acquirer timeouts. Postgres and SQLite."""

from __future__ import annotations

import asyncio
from datetime import date
from pathlib import Path

import pyarrow.parquet as pq

from analytics import duckdb_reference
from analytics.lake import TABLES
from api.db import create_engine
from api.events import export
from tests.analytics.clearing_files import add_clearing, d_row, write_clearing_file
from tests.api.events.rows import MERCHANT, insert_rows, payments
from tests.support.backend import Backend

DAY = date(2020, 3, 2)


def _export(backend: Backend, lake: Path) -> None:
    async def run() -> None:
        engine = create_engine(backend.settings)
        try:
            await export.export_day(engine, lake, DAY)
        finally:
            await engine.dispose()

    asyncio.run(run())


def test_export_writes_the_acquirer_columns_and_the_day_reconciles(
    private_backend: Backend, tmp_path: Path
) -> None:
    rows = payments(DAY, 0, 2)
    approved, timed_out = rows["transactions"]
    approved.update(rrn="RRNAPPROVED1", authorization_code="A1B2C3", decline_reason=None)
    timed_out.update(
        rrn="RRNTIMEOUT01", authorization_code=None, decline_reason="acquirer_timeout",
        status="declined",
    )  # fmt: skip
    rows["ledger_entries"] = rows["ledger_entries"][:1]
    insert_rows(private_backend, rows)
    lake = tmp_path / "lake"
    _export(private_backend, lake)

    written = pq.read_table(lake / "transactions" / f"event_date={DAY}" / "part-0.parquet")
    assert written.schema == TABLES["transactions"]
    got = sorted(
        (r["rrn"], r["authorization_code"], r["decline_reason"]) for r in written.to_pylist()
    )
    assert got == [
        ("RRNAPPROVED1", "A1B2C3", None),
        ("RRNTIMEOUT01", None, "acquirer_timeout"),
    ]

    at = approved["created_at"].strftime("%Y-%m-%d %H:%M:%S")
    amount = approved["amount"]
    row = d_row("RRNAPPROVED1", at, amount, merchant=MERCHANT)
    clearing = write_clearing_file(tmp_path / "c.csv", [row])
    assert add_clearing(clearing, lake).exit_code == 0
    answers = duckdb_reference.audit(lake, start=DAY, end=DAY, threads=1)
    assert [(r["merchant_id"], r["matched"], r["matched_amount"]) for r in
            answers["settlement_recon"]][-1] == ("ALL", 1, amount)  # fmt: skip
    assert answers["settlement_exceptions"] == []
    fleet = [r for r in answers["daily_summary"] if r["merchant_id"] == "ALL"]
    assert [r["acquirer_timeouts"] for r in fleet] == [1]
