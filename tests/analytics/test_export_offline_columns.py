"""``idempay export`` writes lake schema 2's transaction columns (issues 16, 17) from the
database — ``offline``, ``captured_at``, ``duplicate_override`` — and merges a day exported
before them instead of refusing it; the audit reads the result. Postgres and SQLite."""

from __future__ import annotations

import asyncio
import json
from datetime import date, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from analytics import duckdb_reference, manifest
from analytics.lake import TABLES, required_columns
from api.db import create_engine
from api.events import export
from tests.api.events.rows import MERCHANT, insert_rows, moment, payments
from tests.support.backend import Backend

DAY = date(2020, 3, 2)


def _export(backend: Backend, lake: Path) -> export.ExportResult:
    async def run() -> export.ExportResult:
        engine = create_engine(backend.settings)
        try:
            return await export.export_day(engine, lake, DAY)
        finally:
            await engine.dispose()

    return asyncio.run(run())


def _rows() -> dict[str, list[dict[str, object]]]:
    """Three payments: an online one, an offline advice sold 90 minutes earlier and
    declined, and a confirmed duplicate."""
    rows = payments(DAY, 0, 3)
    for row in rows["transactions"]:  # one executemany: every row names the same columns
        row.update(offline=False, captured_at=None, duplicate_override=False)
    online, advice, confirmed = rows["transactions"]
    advice.update(offline=True, captured_at=moment(DAY, 1) - timedelta(minutes=90))
    advice["status"] = "declined"
    confirmed["duplicate_override"] = True
    rows["ledger_entries"] = rows["ledger_entries"][:1] + rows["ledger_entries"][2:]
    assert online["merchant_id"] == MERCHANT
    return rows


def test_export_writes_the_offline_and_override_columns(
    private_backend: Backend, tmp_path: Path
) -> None:
    lake = tmp_path / "lake"
    insert_rows(private_backend, _rows())
    _export(private_backend, lake)

    folder = lake / "transactions" / f"event_date={DAY}"
    written = pq.read_table(folder / "part-0.parquet")
    assert written.schema == TABLES["transactions"]
    by_second = {r["created_at"].second: r for r in written.to_pylist()}
    assert [(by_second[s]["offline"], by_second[s]["duplicate_override"]) for s in (0, 1, 2)] == [
        (False, False),
        (True, False),
        (False, True),
    ]
    assert by_second[1]["captured_at"] == moment(DAY, 1) - timedelta(minutes=90)
    body = json.loads((folder / manifest.MANIFEST).read_text())
    assert (body["schema_version"], body["columns"]) == (3, TABLES["transactions"].names)

    answers = duckdb_reference.audit(lake, start=DAY, end=DAY, threads=1)
    fleet = [r for r in answers["offline_summary"] if r["merchant_id"] == "ALL"]
    assert [
        (r["transactions"], r["offline_transactions"], r["forward_delay_max_s"],
         r["offline_declined"], r["offline_amount_at_risk"]) for r in fleet
    ] == [(3, 1, 5400.0, 1, 1250)]  # fmt: skip
    guard = [r for r in answers["duplicate_guard"] if r["merchant_id"] == "ALL"]
    assert [r["duplicates_overridden"] for r in guard] == [1]


def test_a_day_exported_before_schema_2_is_merged_not_refused(
    private_backend: Backend, tmp_path: Path
) -> None:
    lake = tmp_path / "lake"
    old = payments(DAY, 10, 1)["transactions"][0]  # a row only the old partition holds
    folder = lake / "transactions" / f"event_date={DAY}"
    folder.mkdir(parents=True)
    contract = {name: old.get(name) for name in required_columns("transactions")}
    contract["transaction_id"] = old["id"]
    table = pa.Table.from_pylist([contract]).select(required_columns("transactions"))
    contract_columns = required_columns("transactions")
    schema_1 = pa.schema([TABLES["transactions"].field(n) for n in contract_columns])
    pq.write_table(table.cast(schema_1), folder / "part-0.parquet")
    insert_rows(private_backend, _rows())

    result = _export(private_backend, lake)

    assert result.kept_from_lake["transactions"] == 1
    merged = pq.read_table(folder / "part-0.parquet")
    assert merged.schema == TABLES["transactions"] and merged.num_rows == 4
    kept = [r for r in merged.to_pylist() if r["transaction_id"] == old["id"]]
    assert [(r["offline"], r["captured_at"], r["duplicate_override"], r["rrn"]) for r in kept] == [
        (None, None, None, None)
    ]
    assert manifest.problems(folder, columns=TABLES["transactions"].names) == []
