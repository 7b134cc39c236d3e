"""Every metric of contract §5's daily summary on a hand-built lake, expected values by hand,
from Spark and from the DuckDB reference alike.

The lake (merchant A unless said otherwise; latencies in ms in brackets):

D0 (before the range)
  k12  created 23:00 ........................ its key date is D0: never reported
D1 = 2026-11-20
  k1   created 10:00 [100]                    merchant B uses the same UUID (below)
  k2   created 11:00 [200], replayed 11:00:10 [300]                     retried
  k3   created 12:00 [400], lookup found 12:00:15                       in doubt, 15 s
  k4   lookup not_found 13:00:10, created 13:00:12 [500] attempt 2      in doubt, 0 s;
       retried: attempt 1 never arrived (1 unseen of 2 sent: link loss 1/2)
  k5   created 23:59:58 [600] | D2: in_progress 00:00:01 [50], replayed 00:00:05 [60]
       (spans midnight: a D1 key, retried; its D2 events count on D2)
  k6   created 14:00 [100], key_reused 14:00:30 [10]                    not retried
  k12  replayed 00:30 [100]                                             D1 event only
  k13  created 15:00 [5000] (202), lookup processing 15:00:06, 15:00:07,
       found 15:00:09                                                   in doubt, 9 s
  B/k1 created 10:00:05 [150], replayed 10:00:20 [250]                  retried (B's own)
  transactions t-a1 10:00:00 and t-a2 10:00:30: same terminal, card, amount → 1 suspect
D2 = 2026-11-21
  k7   replayed 09:00:00 [20] before its created 09:00:00.5 [700]       retried
  k8   lookup not_found 10:00 only                                      not a transaction
  k9   lookup not_found 11:00, abort aborted 11:01                      aborted
  k10  create expired 12:00 [30]                                        expired
  k11  created 13:00 [100], reversal reversed 13:05                     reversed
  C    rejected 16:00 [5], error 16:01 [7]: a merchant with only failures
  B    a charge entry without a transaction (08:00): 1 exactly-once violation
D3 = 2026-11-22: no events at all (the fleet row is there, all zeros).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from analytics import duckdb_reference, money, offline, outputs, transforms
from analytics.metrics import SUMMARY_COLUMNS
from tests.analytics.lakes import (
    D1,
    D2,
    D3,
    SUMMARY_SCHEMA,
    as_dicts,
    assert_rows_equal,
    entry,
    ev,
    frame,
    summary_row,
    txn,
    write_lake,
)

K = {
    name: f"00000000-0000-4000-8000-{n:012d}"
    for n, name in enumerate(
        ["k1", "k2", "k3", "k4", "k5", "k6", "k7", "k8", "k9", "k10", "k11", "k12", "k13"], 1
    )
}
C1, C2 = "00000000-0000-4000-8000-0000000000c1", "00000000-0000-4000-8000-0000000000c2"


def _events() -> list[dict[str, object]]:
    return [
        ev(K["k12"], "2026-11-19 23:00:00", "create", "created", latency=100),
        ev(K["k1"], "2026-11-20 10:00:00", "create", "created", latency=100),
        ev(K["k2"], "2026-11-20 11:00:00", "create", "created", latency=200),
        ev(K["k2"], "2026-11-20 11:00:10", "create", "replayed", latency=300),
        ev(K["k3"], "2026-11-20 12:00:00", "create", "created", latency=400),
        ev(K["k3"], "2026-11-20 12:00:15", "lookup", "found"),
        ev(K["k4"], "2026-11-20 13:00:10", "lookup", "not_found", terminal=None),
        ev(K["k4"], "2026-11-20 13:00:12", "create", "created", latency=500, attempt=2),
        ev(K["k5"], "2026-11-20 23:59:58", "create", "created", latency=600),
        ev(K["k5"], "2026-11-21 00:00:01", "create", "in_progress", latency=50),
        ev(K["k5"], "2026-11-21 00:00:05", "create", "replayed", latency=60),
        ev(K["k6"], "2026-11-20 14:00:00", "create", "created", latency=100),
        ev(K["k6"], "2026-11-20 14:00:30", "create", "key_reused", latency=10),
        ev(K["k12"], "2026-11-20 00:30:00", "create", "replayed", latency=100),
        ev(K["k13"], "2026-11-20 15:00:00", "create", "created", latency=5000),
        ev(K["k13"], "2026-11-20 15:00:06", "lookup", "processing"),
        ev(K["k13"], "2026-11-20 15:00:07", "lookup", "processing"),
        ev(K["k13"], "2026-11-20 15:00:09", "lookup", "found"),
        ev(K["k1"], "2026-11-20 10:00:05", "create", "created", merchant="mer_b", latency=150),
        ev(K["k1"], "2026-11-20 10:00:20", "create", "replayed", merchant="mer_b", latency=250),
        ev(K["k7"], "2026-11-21 09:00:00", "create", "replayed", latency=20),
        ev(K["k7"], "2026-11-21 09:00:00.5", "create", "created", latency=700),
        ev(K["k8"], "2026-11-21 10:00:00", "lookup", "not_found", terminal=None),
        ev(K["k9"], "2026-11-21 11:00:00", "lookup", "not_found", terminal=None),
        ev(K["k9"], "2026-11-21 11:01:00", "abort", "aborted", terminal=None),
        ev(K["k10"], "2026-11-21 12:00:00", "create", "expired", latency=30),
        ev(K["k11"], "2026-11-21 13:00:00", "create", "created", latency=100),
        ev(K["k11"], "2026-11-21 13:05:00", "reversal", "reversed"),
        ev(C1, "2026-11-21 16:00:00", "create", "rejected", merchant="mer_c", latency=5),
        ev(C2, "2026-11-21 16:01:00", "create", "error", merchant="mer_c", latency=7),
    ]


def _transactions() -> list[dict[str, Any]]:
    return [txn("t-a1", "2026-11-20 10:00:00"), txn("t-a2", "2026-11-20 10:00:30")]


def _ledger() -> list[dict[str, Any]]:
    return [
        entry("e1", "t-a1", "2026-11-20 10:00:00"),
        entry("e2", "t-a2", "2026-11-20 10:00:30"),
        entry("e3", "t-missing", "2026-11-21 08:00:00", merchant="mer_b"),
    ]


def _summary(spark: SparkSession) -> DataFrame:
    events = transforms.with_event_date(frame(spark, "request_events", _events()), "ts")
    transactions = frame(spark, "transactions", _transactions())
    ledger = frame(spark, "ledger_entries", _ledger())
    return outputs.daily_summary(
        transforms.cubes(events),
        money.suspected_double_charges(transactions),
        money.exactly_once_violations(transactions, ledger),
        offline.transaction_cube(transactions),
        start=D1,
        end=D3,
    )


def _expected() -> list[tuple[Any, ...]]:
    return [
        summary_row(
            D1, "mer_a",
            transactions=7, create_requests=10,
            retried_transactions=3, retry_rate=3 / 7,
            unseen_attempts=1, link_loss_rate=0.5,
            duplicate_requests=2, duplicate_rate=0.2,
            in_doubt_transactions=3, in_doubt_rate=3 / 7,
            lookup_found_rate=2 / 3,
            in_doubt_resolution_p50_s=9.0, in_doubt_resolution_p95_s=14.4,
            key_reused=1, suspected_double_charges=1,
            create_p50_ms=250.0, create_p95_ms=3020.0, create_p99_ms=4604.0,
        ),
        summary_row(
            D1, "mer_b",
            transactions=1, create_requests=2,
            retried_transactions=1, retry_rate=1.0,
            duplicate_requests=1, duplicate_rate=0.5,
            create_p50_ms=200.0, create_p95_ms=245.0, create_p99_ms=249.0,
        ),
        summary_row(
            D1, "ALL",
            transactions=8, create_requests=12,
            retried_transactions=4, retry_rate=0.5,
            unseen_attempts=1, link_loss_rate=0.5,
            duplicate_requests=3, duplicate_rate=0.25,
            in_doubt_transactions=3, in_doubt_rate=0.375,
            lookup_found_rate=2 / 3,
            in_doubt_resolution_p50_s=9.0, in_doubt_resolution_p95_s=14.4,
            key_reused=1, suspected_double_charges=1,
            create_p50_ms=225.0, create_p95_ms=2580.0, create_p99_ms=4516.0,
        ),
        summary_row(
            D2, "mer_a",
            transactions=2, create_requests=6,
            retried_transactions=1, retry_rate=0.5,
            duplicate_requests=3, duplicate_rate=0.5,
            aborted=1, expired=1, reversed=1,
            create_p50_ms=55.0, create_p95_ms=550.0, create_p99_ms=670.0,
        ),
        summary_row(D2, "mer_b", exactly_once_violations=1),
        summary_row(
            D2, "mer_c",
            create_requests=2,
            create_p50_ms=6.0, create_p95_ms=6.9, create_p99_ms=6.98,
        ),
        summary_row(
            D2, "ALL",
            transactions=2, create_requests=8,
            retried_transactions=1, retry_rate=0.5,
            duplicate_requests=3, duplicate_rate=0.375,
            aborted=1, expired=1, reversed=1, exactly_once_violations=1,
            create_p50_ms=40.0, create_p95_ms=490.0, create_p99_ms=658.0,
        ),
        summary_row(D3, "ALL"),
    ]  # fmt: skip


def test_daily_summary_every_metric_by_hand(spark: SparkSession) -> None:
    assertDataFrameEqual(
        _summary(spark),
        spark.createDataFrame(_expected(), SUMMARY_SCHEMA),
        checkRowOrder=True,
        rtol=1e-9,
    )


def test_duckdb_reference_gives_the_same_hand_computed_summary(tmp_path: Path) -> None:
    write_lake(tmp_path, "request_events", _events())
    write_lake(tmp_path, "transactions", _transactions())
    write_lake(tmp_path, "ledger_entries", _ledger())
    rows = duckdb_reference.daily_summary(tmp_path, start=D1, end=D3, threads=2)
    assert_rows_equal(rows, as_dicts(_expected(), SUMMARY_COLUMNS))


def test_range_reports_nothing_outside_it_but_keys_stay_whole(spark: SparkSession) -> None:
    """--from D2 --to D2: k5 (a D1 key) is not a D2 transaction, its D2 events still count."""
    events = transforms.with_event_date(frame(spark, "request_events", _events()), "ts")
    empty_txns = frame(spark, "transactions", [])
    summary = outputs.daily_summary(
        transforms.cubes(events),
        money.suspected_double_charges(empty_txns),
        money.exactly_once_violations(empty_txns, frame(spark, "ledger_entries", [])),
        offline.transaction_cube(empty_txns),
        start=D2,
        end=D2,
    ).where("merchant_id = 'ALL'")
    rows = [(r.event_date, r.transactions, r.create_requests, r.retried_transactions)
            for r in summary.collect()]  # fmt: skip
    assert rows == [(D2, 2, 8, 1)]


def test_latency_percentiles_are_sparks_percentile_to_the_bit(spark: SparkSession) -> None:
    """``create_latencies`` reads percentiles from sorted arrays; on 400 groups of 1–60
    values (ties, several magnitudes), each equals Spark's exact ``percentile`` exactly."""
    rng = random.Random(1)
    rows = [
        (group, rng.lognormvariate(5, 1) * rng.choice([1.0, 1.0001, 3.3]))
        for group in range(400)
        for _ in range(rng.randint(1, 60))
    ]
    values = spark.createDataFrame(rows, "group int, v double")
    fractions = [0.5, 0.95, 0.99]
    expected = values.groupBy("group").agg(F.percentile("v", fractions).alias("p"))
    ordered = values.groupBy("group").agg(F.array_sort(F.collect_list("v")).alias("a"))
    actual = ordered.select(
        "group",
        F.array(*[transforms.percentile_of_sorted(F.col("a"), f) for f in fractions]).alias("p"),
    )
    assertDataFrameEqual(actual, expected, rtol=0.0, atol=0.0)
