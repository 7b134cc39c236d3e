"""What the report's money section stands on: ``money_volume`` (approved, refunded and
reversed volume per currency, on planted cases, in Spark), and the marker that says a
lake's day is synthesized (written by ``analytics.synth``, gone once a day is exported)."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pyarrow.parquet as pq
from pyspark.sql import SparkSession

from analytics import manifest, money
from analytics.html_table import money as money_text
from analytics.jobs.daily_audit import run_audit
from analytics.lake import TABLES, partition_dir, write_partition
from analytics.synth import SynthConfig, synthesize
from tests.analytics.lakes import D1, D2, D3, entry, ev, frame, txn, write_lake


def test_money_volume_per_currency(spark: SparkSession) -> None:
    transactions = [
        txn("p1", "2026-11-20 10:00:00", amount=54990),
        txn("p1", "2026-11-20 10:00:00", amount=54990),  # read twice: counted once
        txn("p2", "2026-11-20 11:00:00", amount=1010, merchant="mer_b"),
        txn("p3", "2026-11-20 12:00:00", amount=700, status="declined"),  # no money
        txn("f1", "2026-11-20 13:00:00", amount=5000, type_="refund"),
        txn("v1", "2026-11-20 14:00:00", amount=2500, status="reversed"),  # not approved
        txn("u1", "2026-11-20 15:00:00", amount=1999, currency="USD"),
        txn("p4", "2026-11-21 00:00:01", amount=300),  # the next day
        txn("p5", "2026-11-22 09:00:00", amount=999),  # out of the range
        txn("p0", "2026-11-19 23:59:59", amount=999),  # out of the range
    ]
    rows = money.money_volume(frame(spark, "transactions", transactions), start=D1, end=D2)
    assert rows.columns == money.MONEY_COLUMNS
    got = [
        (r["event_date"].isoformat(), r["merchant_id"], r["currency"], *list(r)[3:])
        for r in rows.collect()
    ]
    # day, merchant, currency, approved (n, amount), refunds (n, amount), reversed (n, amount)
    assert got == [
        ("2026-11-20", "mer_a", "BRL", 1, 54990, 1, 5000, 1, 2500),
        ("2026-11-20", "mer_a", "USD", 1, 1999, 0, 0, 0, 0),
        ("2026-11-20", "mer_b", "BRL", 1, 1010, 0, 0, 0, 0),
        ("2026-11-20", "ALL", "BRL", 2, 56000, 1, 5000, 1, 2500),
        ("2026-11-20", "ALL", "USD", 1, 1999, 0, 0, 0, 0),
        ("2026-11-21", "mer_a", "BRL", 1, 300, 0, 0, 0, 0),
        ("2026-11-21", "ALL", "BRL", 1, 300, 0, 0, 0, 0),
    ]


def test_synthesized_days_are_marked_until_exported(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    synthesize(
        SynthConfig(lake=lake, days=2, events_per_day=300, seed=3, start=D1, merchants=1,
                    terminals_per_merchant=4)
    )  # fmt: skip
    days = manifest.synthesized_days(lake)
    assert days[:2] == [D1, D2] and all(d <= D3 for d in days)  # D3: payments past midnight
    for table in manifest.DAY_TABLES:
        folder = partition_dir(lake, table, D1)
        assert (folder / manifest.SYNTHESIZED).is_file()
        # the marker is not damage: the partition is intact as its writer described it
        assert manifest.problems(folder, columns=TABLES[table].names) == [], table
    # The server's rows exported into D2 (as `idempay export` writes them: each table's
    # partition replaced): D2 is real traffic from then on.
    for table in manifest.DAY_TABLES:
        write_partition(lake, table, D2, [TABLES[table].empty_table()])
    assert D2 not in manifest.synthesized_days(lake) and D1 in manifest.synthesized_days(lake)
    # one table replaced is enough: a day with any real partition is not made up
    write_partition(lake, "request_events", D1, [TABLES["request_events"].empty_table()])
    assert D1 not in manifest.synthesized_days(lake)
    assert manifest.synthesized_days("s3a://bucket/lake") == []
    assert manifest.synthesized_days(tmp_path / "nothing") == []


def test_the_audits_report_leads_with_the_lakes_money(spark: SparkSession, tmp_path: Path) -> None:
    """The whole audit over two synthesized days and a real one (exported over the
    synthesis' payments past midnight): money_volume.csv holds the lake's volume, the report
    shows it in currency units, marks the two days, and every CSV it links is there."""
    lake, out = tmp_path / "lake", tmp_path / "out"
    synthesize(
        SynthConfig(lake=lake, days=2, events_per_day=400, seed=4, start=D1, merchants=2,
                    terminals_per_merchant=5)
    )  # fmt: skip
    write_lake(lake, "transactions", [txn("real-1", "2026-11-22 10:00:00", amount=54990)])
    write_lake(lake, "request_events", [ev("real-1", "2026-11-22 10:00:00", "create", "created")])
    write_lake(lake, "ledger_entries", [entry("e-real-1", "real-1", "2026-11-22 10:00:00",
                                              amount=54990)])  # fmt: skip
    result = run_audit(spark, lake=str(lake), out=out, start=D1, end=D3)

    sold = pq.read_table(lake / "transactions").to_pylist()
    expected: dict[str, int] = {}
    for row in sold:
        if row["type"] == "purchase" and row["status"] == "approved":
            day = row["created_at"].date().isoformat()
            expected[day] = expected.get(day, 0) + row["amount"]
    with (out / "money_volume.csv").open(newline="") as handle:
        fleet = [r for r in csv.DictReader(handle) if r["merchant_id"] == "ALL"]
    assert {r["event_date"]: int(r["approved_amount"]) for r in fleet} == {
        d: a for d, a in expected.items() if d <= D3.isoformat()
    }
    assert {r["currency"] for r in fleet} == {"BRL"}

    html = result.report.read_text(encoding="utf-8")
    total = sum(a for d, a in expected.items() if d <= D3.isoformat())
    card = re.search(r'data-currency="BRL" data-metric="approved_amount" data-value="(\d+)">'
                     r'<div class="v">([^<]+)</div>', html)  # fmt: skip
    assert card is not None and int(card[1]) == total and card[2] == money_text(total, "BRL")
    assert 'id="no-money-volume"' not in html
    assert "2 of 3 days are synthesized" in html and "Real traffic: 2026-11-22" in html
    links = re.findall(r'href="([^"#]+\.csv)"', html)
    assert links and all((out / link).is_file() for link in links), links
    assert "money_volume.csv" in links
