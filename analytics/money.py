"""The money of contract §5 as pure ``DataFrame → DataFrame`` transforms: suspected
double charges (new-key duplicates the idempotency key could not catch), exactly-once
violations (a transaction charged twice, or a charge without a transaction), and the
volume per currency the report leads with (``money_volume``: approved, refunded, reversed).

Both take the lake's tables as read, duplicates included: each one deduplicates exactly what
it uses, in the shuffle it needs anyway (a row read twice is one row: a transaction is
``(merchant_id, transaction_id)``, an entry its ``entry_id``).
"""

from __future__ import annotations

from datetime import date

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from analytics.metrics import DOUBLE_CHARGE_COLUMNS, FLEET, VIOLATION_COLUMNS

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
    ordered = Window.partitionBy(*SUSPECT_ORDER).orderBy("created_at", "transaction_id")
    purchases = (
        transactions.where(is_approved_purchase())
        .select(*SUSPECT_GROUP, "transaction_id", "created_at")
        .repartition(*SUSPECT_ORDER)
        .dropDuplicates([*SUSPECT_ORDER, "transaction_id"])
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


DOUBLED, ORPHAN = "duplicate_charge", "charge_without_transaction"
# Grouping and sorting by the UUID first: its first bytes tell rows apart, so Spark's sort
# settles on 8-byte prefixes instead of comparing whole rows (every row of a merchant shares
# the merchant id's prefix).
TXN_ORDER = ["transaction_id", "merchant_id"]
SUSPECT_ORDER = ["card_fingerprint", "terminal_id", "merchant_id", "amount", "currency"]


def _ledger_keys(transactions: DataFrame, ledger_entries: DataFrame) -> DataFrame:
    """One row per (merchant_id, transaction_id) of either table: ``transaction_rows`` read
    (copies included) and the earliest ``txn_at``; ``entry_rows`` read, ``entries``
    (distinct ``entry_id``) and ``charges`` (distinct charge entries). One shuffle of both
    tables by the key, no join; the aggregates keep fixed-width buffers, so Spark hashes
    instead of sorting."""
    none = F.lit(None)
    txn_side = transactions.select(
        *TXN_KEY,
        F.col("created_at").alias("txn_at"),
        none.cast("string").alias("entry_id"),
        F.lit(False).alias("is_charge"),
    )
    entry_side = ledger_entries.select(
        *TXN_KEY,
        none.cast("timestamp").alias("txn_at"),
        "entry_id",
        is_charge().alias("is_charge"),
    )
    per_entry = (
        txn_side.unionByName(entry_side)
        .repartition(*TXN_ORDER)
        .groupBy(*TXN_ORDER, "entry_id")
        .agg(
            F.count("txn_at").alias("transaction_rows"),
            F.min("txn_at").alias("txn_at"),
            F.count("entry_id").alias("entry_rows"),
            F.bool_or("is_charge").alias("is_charge"),
        )
    )
    return per_entry.groupBy(*TXN_ORDER).agg(
        F.sum("transaction_rows").alias("transaction_rows"),
        F.min("txn_at").alias("txn_at"),
        F.sum("entry_rows").alias("entry_rows"),
        F.count("entry_id").alias("entries"),
        F.count_if(F.col("is_charge") & F.col("entry_id").isNotNull()).alias("charges"),
    )


def ledger_days(transactions: DataFrame, ledger_entries: DataFrame) -> DataFrame:
    """The ledger pass, summed per transaction date (null for keys without a transaction):
    a few rows. ``transactions`` (distinct), ``transaction_rows`` (read), ``entries``
    (distinct), ``entry_rows`` (read); ``doubled``: the transactions of the day with more
    than one charge entry, as (transaction key, charge entries) rows; ``orphan_keys``: the
    keys with charges but no transaction (on the null day)."""
    keys = _ledger_keys(transactions, ledger_entries)
    exists = F.col("transaction_rows") > 0
    key = F.struct(*TXN_KEY)
    doubled = F.when(exists & (F.col("charges") > 1), F.struct(*TXN_KEY, "charges"))
    orphan = F.when(~exists & (F.col("charges") > 0), key)
    return keys.groupBy(F.to_date("txn_at").alias("event_date")).agg(
        F.count_if(exists).alias("transactions"),
        F.sum("transaction_rows").alias("transaction_rows"),
        F.sum("entries").alias("entries"),
        F.sum("entry_rows").alias("entry_rows"),
        F.collect_list(doubled).alias("doubled"),
        F.collect_list(orphan).alias("orphan_keys"),
    )


def violations_of(days: DataFrame, ledger_entries: DataFrame) -> DataFrame:
    """The exactly-once violations of ``ledger_days``: one row per doubled transaction
    (dated by it), and one per charge entry of an orphan key (dated by the entry), read
    back from the ledger by a broadcast semi-join with those few keys (Spark skips the
    read when there is none)."""
    doubled = days.select("event_date", F.explode("doubled").alias("d")).select(
        "event_date",
        "d.merchant_id",
        "d.transaction_id",
        F.lit(DOUBLED).alias("violation"),
        F.col("d.charges").alias("charge_entries"),
        F.lit(None).cast("string").alias("entry_id"),
    )
    orphan_keys = days.select(F.explode("orphan_keys").alias("k")).select("k.*")
    orphans = (
        ledger_entries.where(is_charge())
        .join(F.broadcast(orphan_keys), on=TXN_KEY, how="left_semi")
        .dropDuplicates(["entry_id"])
        .select(
            F.to_date("created_at").alias("event_date"),
            *TXN_KEY,
            F.lit(ORPHAN).alias("violation"),
            F.lit(1).cast("long").alias("charge_entries"),
            "entry_id",
        )
    )
    return doubled.unionByName(orphans).select(*VIOLATION_COLUMNS)


def exactly_once_violations(transactions: DataFrame, ledger_entries: DataFrame) -> DataFrame:
    """Transactions with more than one charge entry (dated by the transaction), and charge
    entries whose transaction does not exist (dated by the entry). Must be empty."""
    return violations_of(ledger_days(transactions, ledger_entries), ledger_entries)


# money_volume: per event_date (of the transaction's created_at) × merchant × currency, plus
# the fleet row ``ALL`` per event_date × currency. Amounts are minor units of the row's
# currency, never summed across currencies.
MONEY_COLUMNS = [
    "event_date",
    "merchant_id",
    "currency",
    "approved_purchases",
    "approved_amount",
    "refunds",
    "refunded_amount",
    "reversed_transactions",
    "reversed_amount",
]


def money_volume(transactions: DataFrame, *, start: date, end: date) -> DataFrame:
    """What moved, per currency: ``approved_purchases``/``approved_amount`` (purchases whose
    status is approved: a reversed one is not), ``refunds``/``refunded_amount`` (refunds
    approved, amounts positive), ``reversed_transactions``/``reversed_amount`` (approved,
    then undone by a reversal: status reversed). A transaction counts on its created_at
    date; a row read twice counts once. One shuffle (the rollup)."""
    unique = transactions.dropDuplicates(TXN_KEY)
    purchase = is_approved_purchase()
    refund = (F.col("type") == "refund") & (F.col("status") == "approved")
    reversed_ = F.col("status") == "reversed"

    def amount(when: Column) -> Column:
        return F.sum(F.when(when, F.col("amount")).otherwise(F.lit(0))).cast("long")

    rolled = (
        unique.withColumn("event_date", F.to_date(F.col("created_at")))
        .rollup("event_date", "currency", "merchant_id")
        .agg(
            F.count_if(purchase).cast("long").alias("approved_purchases"),
            amount(purchase).alias("approved_amount"),
            F.count_if(refund).cast("long").alias("refunds"),
            amount(refund).alias("refunded_amount"),
            F.count_if(reversed_).cast("long").alias("reversed_transactions"),
            amount(reversed_).alias("reversed_amount"),
            F.grouping("event_date").alias("day_total"),
            F.grouping("currency").alias("all_currencies"),
            F.grouping("merchant_id").alias("fleet"),
        )
        .where((F.col("day_total") == 0) & (F.col("all_currencies") == 0))
        .withColumn(
            "merchant_id",
            F.when(F.col("fleet") == 1, F.lit(FLEET)).otherwise(F.col("merchant_id")),
        )
    )
    is_fleet = F.col("merchant_id") == FLEET
    return (
        rolled.where(F.col("event_date").between(F.lit(start), F.lit(end)))
        .orderBy("event_date", is_fleet.asc(), "merchant_id", "currency")
        .select(*MONEY_COLUMNS)
    )
