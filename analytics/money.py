"""The money checks of contract §5 as pure ``DataFrame → DataFrame`` transforms: suspected
double charges (new-key duplicates the idempotency key could not catch) and exactly-once
violations (a transaction charged twice, or a charge without a transaction).

Both take the lake's tables as read, duplicates included: each one deduplicates exactly what
it uses, in the shuffle it needs anyway (a row read twice is one row: a transaction is
``(merchant_id, transaction_id)``, an entry its ``entry_id``).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from analytics.metrics import DOUBLE_CHARGE_COLUMNS, VIOLATION_COLUMNS

SUSPECT_WINDOW_MICROS = 120 * 1_000_000
TXN_KEY = ["merchant_id", "transaction_id"]
SUSPECT_GROUP = ["merchant_id", "terminal_id", "card_fingerprint", "amount", "currency"]


def is_approved_purchase() -> Column:
    return (F.col("type") == "purchase") & (F.col("status") == "approved")


def is_charge() -> Column:
    return F.col("kind") == "charge"


def suspected_double_charges(transactions: DataFrame) -> DataFrame:
    """Consecutive approved purchases of one (merchant, terminal, card, amount, currency)
    at most 120 s apart (inclusive) under different keys; dated by the later one.

    One shuffle (by the group): copies of a row land together and are dropped there, and
    the window needs no other exchange."""
    ordered = Window.partitionBy(*SUSPECT_GROUP).orderBy("created_at", "transaction_id")
    purchases = (
        transactions.where(is_approved_purchase())
        .select(*SUSPECT_GROUP, "transaction_id", "created_at")
        .repartition(*SUSPECT_GROUP)
        .dropDuplicates([*SUSPECT_GROUP, "transaction_id"])
    )
    pairs = (
        purchases.withColumn("first_transaction_id", F.lag("transaction_id").over(ordered))
        .withColumn("first_created_at", F.lag("created_at").over(ordered))
        .withColumn(
            "micros_apart",
            F.unix_micros(F.col("created_at")) - F.unix_micros(F.col("first_created_at")),
        )
    )
    is_suspect = (
        F.col("first_transaction_id").isNotNull()
        & (F.col("first_transaction_id") != F.col("transaction_id"))
        & (F.col("micros_apart") <= SUSPECT_WINDOW_MICROS)
    )
    return (
        pairs.where(is_suspect)
        .select(
            F.to_date(F.col("created_at")).alias("event_date"),
            *SUSPECT_GROUP[:4],
            "currency",
            "first_transaction_id",
            F.col("transaction_id").alias("second_transaction_id"),
            (F.col("micros_apart") / F.lit(1_000_000.0)).alias("seconds_apart"),
        )
        .select(*DOUBLE_CHARGE_COLUMNS)
    )


def exactly_once_violations(transactions: DataFrame, ledger_entries: DataFrame) -> DataFrame:
    """Transactions with more than one charge entry (dated by the transaction), and charge
    entries whose transaction does not exist (dated by the entry). Must be empty.

    Both sides are partitioned by (merchant_id, transaction_id) once — the transactions by
    their groupBy, the charges by a repartition that also drops copied entries — so the
    join and the window over its output need no further shuffle."""
    known = transactions.groupBy(*TXN_KEY).agg(F.min("created_at").alias("txn_created_at"))
    charges = (
        ledger_entries.where(is_charge())
        .select(*TXN_KEY, "entry_id", "created_at")
        .repartition(*TXN_KEY)
        .dropDuplicates([*TXN_KEY, "entry_id"])
    )
    per_transaction = Window.partitionBy(*TXN_KEY)
    matched = (
        charges.join(known, on=TXN_KEY, how="left")
        .withColumn("charge_entries", F.count(F.lit(1)).over(per_transaction))
        .withColumn("nth", F.row_number().over(per_transaction.orderBy("entry_id")))
    )
    is_orphan = F.col("txn_created_at").isNull()
    is_doubled = ~is_orphan & (F.col("charge_entries") > 1) & (F.col("nth") == 1)
    return (
        matched.where(is_orphan | is_doubled)
        .select(
            F.to_date(F.coalesce(F.col("txn_created_at"), F.col("created_at"))).alias("event_date"),
            *TXN_KEY,
            F.when(is_orphan, F.lit("charge_without_transaction"))
            .otherwise(F.lit("duplicate_charge"))
            .alias("violation"),
            F.when(is_orphan, F.lit(1).cast("long"))
            .otherwise(F.col("charge_entries"))
            .alias("charge_entries"),
            F.when(is_orphan, F.col("entry_id")).alias("entry_id"),
        )
        .select(*VIOLATION_COLUMNS)
    )
