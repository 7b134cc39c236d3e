"""suspected_double_charges and exactly_once_violations on planted cases (contract §5)."""

from __future__ import annotations

from pyspark.sql import SparkSession
from pyspark.sql.types import (
    DateType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
)
from pyspark.testing import assertDataFrameEqual

from analytics import money
from tests.analytics.lakes import D1, D2, entry, frame, txn

SUSPECTS = StructType(
    [
        StructField("event_date", DateType()),
        StructField("merchant_id", StringType()),
        StructField("terminal_id", StringType()),
        StructField("card_fingerprint", StringType()),
        StructField("amount", LongType()),
        StructField("currency", StringType()),
        StructField("first_transaction_id", StringType()),
        StructField("second_transaction_id", StringType()),
        StructField("seconds_apart", DoubleType()),
    ]
)
VIOLATIONS = StructType(
    [
        StructField("event_date", DateType()),
        StructField("merchant_id", StringType()),
        StructField("transaction_id", StringType()),
        StructField("violation", StringType()),
        StructField("charge_entries", LongType()),
        StructField("entry_id", StringType()),
    ]
)


def test_suspects_are_the_planted_new_key_duplicates_and_nothing_else(
    spark: SparkSession,
) -> None:
    # One (merchant A, T-1, fp-card-1, 1250 BRL) group unless said otherwise; the cases
    # are hours apart so only the planted pairs are neighbours within 120 s.
    transactions = [
        txn("s1", "2026-11-20 10:00:00"),
        txn("s2", "2026-11-20 10:02:00"),  # exactly 120 s after s1: a suspect (inclusive)
        txn("s3", "2026-11-20 10:04:00.000001"),  # 120.000001 s after s2: not
        txn("r1", "2026-11-20 11:00:00"),
        txn("r2", "2026-11-20 11:00:30", status="reversed"),  # undone: not a suspect
        txn("c1", "2026-11-20 12:00:00"),
        txn("c2", "2026-11-20 12:00:10", card="fp-card-2"),  # another card
        txn("a1", "2026-11-20 13:00:00"),
        txn("a2", "2026-11-20 13:00:05", amount=1300),  # another amount
        txn("u1", "2026-11-20 13:30:00", currency="USD"),
        txn("u2", "2026-11-20 13:30:05"),  # another currency than u1
        txn("x1", "2026-11-20 14:00:00"),
        txn("x2", "2026-11-20 14:00:05", terminal="T-2"),  # another terminal
        txn("y1", "2026-11-20 15:00:00"),
        txn("y2", "2026-11-20 15:00:05", merchant="mer_b"),  # another merchant
        txn("d1", "2026-11-20 16:00:00"),
        txn("d2", "2026-11-20 16:00:10", status="declined"),  # declined: no money moved
        txn("f1", "2026-11-20 17:00:00", type_="refund"),
        txn("f2", "2026-11-20 17:00:10", type_="refund"),  # refunds are not purchases
        txn("t1", "2026-11-20 18:00:00"),
        txn("t2", "2026-11-20 18:00:30"),  # two suspects in a row: (t1, t2) and (t2, t3)
        txn("t3", "2026-11-20 18:01:00"),
        txn("m1", "2026-11-20 23:59:30"),
        txn("m2", "2026-11-21 00:00:20"),  # across midnight: dated by the later one (D2)
    ]
    actual = money.suspected_double_charges(frame(spark, "transactions", transactions))
    expected = [
        (D1, "mer_a", "T-1", "fp-card-1", 1250, "BRL", "s1", "s2", 120.0),
        (D1, "mer_a", "T-1", "fp-card-1", 1250, "BRL", "t1", "t2", 30.0),
        (D1, "mer_a", "T-1", "fp-card-1", 1250, "BRL", "t2", "t3", 30.0),
        (D2, "mer_a", "T-1", "fp-card-1", 1250, "BRL", "m1", "m2", 50.0),
    ]
    assertDataFrameEqual(actual, spark.createDataFrame(expected, SUSPECTS), rtol=1e-12)


def test_exactly_once_violations_flags_planted_ones(spark: SparkSession) -> None:
    transactions = [
        txn("v1", "2026-11-20 10:00:00"),
        txn("v2", "2026-11-20 11:00:00", status="reversed"),
        txn("v3", "2026-11-20 12:00:00", type_="refund"),
        txn("v4", "2026-11-20 13:00:00"),  # merchant A's; B shares the UUID
    ]
    ledger = [
        entry("e1", "v1", "2026-11-20 10:00:00"),
        entry("e2", "v1", "2026-11-21 09:00:00"),  # second charge, a day later: v1's date
        entry("e3", "v2", "2026-11-20 11:00:00"),
        entry("e4", "v2", "2026-11-20 11:05:00", amount=-1250, kind="reversal"),
        entry("e5", "v3", "2026-11-20 12:00:00", amount=-1250, kind="refund"),
        entry("e6", "v4", "2026-11-20 13:00:00"),
        entry("e9", "ghost", "2026-11-21 08:00:00"),  # a charge without a transaction
        entry("e10", "v4", "2026-11-21 07:00:00", merchant="mer_b"),  # B has no v4
        entry("e11", "ghost-refund", "2026-11-21 08:00:00", amount=-10, kind="refund"),
    ]
    actual = money.exactly_once_violations(
        frame(spark, "transactions", transactions), frame(spark, "ledger_entries", ledger)
    )
    expected = [
        (D1, "mer_a", "v1", "duplicate_charge", 2, None),
        (D2, "mer_a", "ghost", "charge_without_transaction", 1, "e9"),
        (D2, "mer_b", "v4", "charge_without_transaction", 1, "e10"),
    ]
    assertDataFrameEqual(actual, spark.createDataFrame(expected, VIOLATIONS))


def test_exactly_once_violations_is_empty_on_a_healthy_ledger(spark: SparkSession) -> None:
    transactions = [
        txn("h1", "2026-11-20 10:00:00"),
        txn("h2", "2026-11-20 10:00:01", status="reversed"),
        txn("h3", "2026-11-20 10:00:02", status="declined"),
    ]
    ledger = [
        entry("e1", "h1", "2026-11-20 10:00:00"),
        entry("e2", "h2", "2026-11-20 10:00:01"),
        entry("e3", "h2", "2026-11-20 10:10:00", amount=-1250, kind="reversal"),
    ]
    actual = money.exactly_once_violations(
        frame(spark, "transactions", transactions), frame(spark, "ledger_entries", ledger)
    )
    assert actual.count() == 0
