"""The audit of offline selling and of the duplicate guard (issues 16, 17): every value of
offline_summary, offline_terminals and duplicate_guard computed by hand on a small lake, by
Spark and by the DuckDB reference."""

from __future__ import annotations

from datetime import date
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from analytics import duckdb_reference
from analytics.jobs.daily_audit import audit_tables, collect
from analytics.metrics import GUARD_COLUMNS, OFFLINE_COLUMNS, OFFLINE_TERMINAL_COLUMNS
from tests.analytics.lakes import D0, D1, D2, D3, as_dicts, assert_rows_equal, ev, txn, write_lake


def _blocked(key: str, moment: str, **kwargs: Any) -> dict[str, Any]:
    """The guard's answer as the server records it: create, rejected, 409."""
    return {**ev(key, moment, "create", "rejected", **kwargs), "http_status": 409}


def _lake(root: Path) -> None:
    transactions = [
        # D0, before the range: never reported.
        txn("z1", "2026-11-19 12:00:00", offline=True, captured="2026-11-19 11:00:00"),
        # D1, merchant A (BRL).
        txn("a1", "2026-11-20 10:00:00", card="fp-1"),  # online
        txn("a2", "2026-11-20 10:00:00", card="fp-2", offline=True, captured="2026-11-20 09:00:00"),
        # a copy of a2 read twice (a second row): counted once
        txn("a2", "2026-11-20 10:00:00", card="fp-2", offline=True, captured="2026-11-20 09:00:00"),
        txn(
            "a3",
            "2026-11-20 10:01:00",
            card="fp-3",
            amount=5000,
            status="declined",
            offline=True,
            captured="2026-11-20 09:59:00",
        ),  # 120 s, declined: 5,000 at risk
        txn(
            "a4",
            "2026-11-20 01:00:00",
            terminal="T-2",
            card="fp-4",
            offline=True,
            captured="2026-11-19 23:00:00",
        ),  # 7,200 s, sold the day before: forwarded after day end
        txn("a5", "2026-11-20 10:05:00", terminal="T-2", card="fp-5", override=True),
        # D1, merchant B: one BRL declined advice, one USD advice.
        txn(
            "b2",
            "2026-11-20 12:00:00",
            merchant="mer_b",
            terminal="T-9",
            amount=900,
            status="declined",
            offline=True,
            captured="2026-11-20 08:00:00",
        ),  # 14,400 s
        txn(
            "b1",
            "2026-11-20 11:00:30.5",
            merchant="mer_b",
            terminal="T-9",
            amount=700,
            currency="USD",
            offline=True,
            captured="2026-11-20 11:00:00",
        ),  # 30.5 s
        # D2, merchant A.
        txn("c1", "2026-11-21 08:00:00", offline=True, captured="2026-11-19 20:00:00"),  # 36 h
        txn("c2", "2026-11-21 09:00:00", card="fp-7", captured="2026-11-21 08:00:00"),  # online
        txn("c3", "2026-11-21 09:30:00", terminal="T-3", card="fp-8", override=True),
    ]
    events = [
        _blocked("g1", "2026-11-20 10:04:30"),
        _blocked("g2", "2026-11-20 23:59:59.999999"),
        ev("r1", "2026-11-20 10:06:00", "create", "rejected"),  # 422: not the guard
        ev("p1", "2026-11-20 10:07:00", "create", "in_progress", merchant="mer_b"),  # 409
        _blocked("g3", "2026-11-21 00:00:00", merchant="mer_b"),
        _blocked("g0", "2026-11-19 10:00:00"),  # before the range
        ev("a1", "2026-11-20 10:00:00", "create", "created", attempt=1),
    ]
    write_lake(root, "transactions", transactions)
    write_lake(root, "request_events", events)
    write_lake(root, "ledger_entries", [])


def _offline_row(day: date, merchant: str, currency: str, *values: Any) -> tuple[Any, ...]:
    return (day, merchant, currency, *values)


# transactions, offline, rate, p50, p95, max, declined, decline rate, at risk, after day end
EXPECTED_SUMMARY = [
    # A, D1: a1..a5 (a2 once); delays 120, 3600, 7200: p95 = 3600 + 0.9 × 3600.
    _offline_row(D1, "mer_a", "BRL", 5, 3, 0.6, 3600.0, 6840.0, 7200.0, 1, 1 / 3, 5000, 1),
    _offline_row(D1, "mer_b", "BRL", 1, 1, 1.0, 14400.0, 14400.0, 14400.0, 1, 1.0, 900, 0),
    _offline_row(D1, "mer_b", "USD", 1, 1, 1.0, 30.5, 30.5, 30.5, 0, 0.0, 0, 0),
    # the fleet in BRL: delays 120, 3600, 7200, 14400: p50 = 5400, p95 = 7200 + 0.85 × 7200.
    _offline_row(D1, "ALL", "BRL", 6, 4, 4 / 6, 5400.0, 13320.0, 14400.0, 2, 0.5, 5900, 1),
    _offline_row(D1, "ALL", "USD", 1, 1, 1.0, 30.5, 30.5, 30.5, 0, 0.0, 0, 0),
    # D2: c2's captured_at is not an offline sale's; c1 was sold two days before.
    _offline_row(D2, "mer_a", "BRL", 3, 1, 1 / 3, 129600.0, 129600.0, 129600.0, 0, 0.0, 0, 1),
    _offline_row(D2, "ALL", "BRL", 3, 1, 1 / 3, 129600.0, 129600.0, 129600.0, 0, 0.0, 0, 1),
]
EXPECTED_TERMINALS = [
    # T-1 on D1: a1, a2, a3; delays 120, 3600: p50 1860, p95 120 + 0.95 × 3480.
    (D1, "mer_a", "T-1", "BRL", 3, 2, 2 / 3, 1860.0, 3426.0, 3600.0, 1, 0.5, 5000, 0),
    (D1, "mer_a", "T-2", "BRL", 2, 1, 0.5, 7200.0, 7200.0, 7200.0, 0, 0.0, 0, 1),
    (D1, "mer_b", "T-9", "BRL", 1, 1, 1.0, 14400.0, 14400.0, 14400.0, 1, 1.0, 900, 0),
    (D1, "mer_b", "T-9", "USD", 1, 1, 1.0, 30.5, 30.5, 30.5, 0, 0.0, 0, 0),
    (D2, "mer_a", "T-1", "BRL", 2, 1, 0.5, 129600.0, 129600.0, 129600.0, 0, 0.0, 0, 1),
]
EXPECTED_GUARD = [
    (D1, "mer_a", 2, 1),  # g1, g2 (the day's last microsecond); a5
    (D1, "ALL", 2, 1),
    (D2, "mer_a", 0, 1),  # c3
    (D2, "mer_b", 1, 0),  # g3
    (D2, "ALL", 1, 1),
    (D3, "ALL", 0, 0),  # a quiet day of the range keeps its fleet row
]


def _expected() -> dict[str, list[dict[str, Any]]]:
    return {
        "offline_summary": as_dicts(EXPECTED_SUMMARY, OFFLINE_COLUMNS),
        "offline_terminals": as_dicts(EXPECTED_TERMINALS, OFFLINE_TERMINAL_COLUMNS),
        "duplicate_guard": as_dicts(EXPECTED_GUARD, GUARD_COLUMNS),
    }


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("offline-lake")
    _lake(root)
    return root


def test_offline_and_guard_metrics_by_hand_in_spark(spark: SparkSession, lake: Path) -> None:
    tables = audit_tables(spark, lake=str(lake), start=D1, end=D3)
    for name, expected in _expected().items():
        assert_rows_equal(collect(tables[name]), expected)


def test_duckdb_reference_gives_the_same_hand_computed_answers(lake: Path) -> None:
    answers = duckdb_reference.audit(lake, start=D1, end=D3, threads=1)
    for name, expected in _expected().items():
        assert_rows_equal(answers[name], expected)


def test_nothing_outside_the_range(spark: SparkSession, lake: Path) -> None:
    tables = audit_tables(spark, lake=str(lake), start=D0, end=D0)
    summary = collect(tables["offline_summary"])
    assert [(r["merchant_id"], r["offline_transactions"]) for r in summary] == [
        ("mer_a", 1),
        ("ALL", 1),
    ]
    assert collect(tables["duplicate_guard"]) == as_dicts(
        [(D0, "mer_a", 1, 0), (D0, "ALL", 1, 0)], GUARD_COLUMNS
    )
