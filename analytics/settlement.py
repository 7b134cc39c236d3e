"""Settlement reconciliation (contract §5): our transactions against the acquirer's clearing
rows, matched by ``rrn``, as pure ``DataFrame → DataFrame`` transforms.

One shuffle: both sides are unioned and grouped by rrn (:func:`by_rrn`), and each rrn
yields its outcomes (:func:`outcomes`):

- our **approved** transaction, when its ``event_date`` has a clearing file in the lake:
  ``matched`` (an unreversed clearing row with the same signed amount and currency),
  ``amount_mismatch`` (an unreversed row whose amount or currency differs) or ``ours_only``
  (no unreversed row: a sale not paid) — on the transaction's event_date and merchant;
- an rrn with an unreversed clearing row and no approved transaction of ours (declined,
  reversed or absent): ``acquirer_only`` — a customer charged without a sale — on the
  clearing row's date and merchant, naming our transaction when we have one;
- an rrn with more than one clearing row: ``duplicate_rrn``, on the latest row's date.

Days are matched by rrn whatever they are: an authorization the acquirer approved at
23:59:59 (in day D's clearing file) whose transaction our server finished at 00:00:01 (on
D + 1) is one match, counted on D + 1, the transaction's event_date. A reversed clearing
row is no net approval: a reversal (0400) or reversal advice (0420) that reached the
acquirer clears the authorization, and with our transaction reversed or declined that rrn
is no exception. Amounts are signed as they move money: refunds negative, as the clearing
trailer's ``net_amount``. A transaction without an rrn (a partition older than lake
schema 3) cannot be matched and is left out: the audit says so in a note.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from analytics.metrics import EXCEPTION_COLUMNS, EXCEPTION_KINDS, FLEET, RECON_COLUMNS
from analytics.transforms import grouped_by_merchant, in_range

TXN_KEY = ["merchant_id", "transaction_id"]
MATCHED = "matched"
REFUND_PREFIX = "20"


# ----------------------------------------------------------------- named conditions
def is_ours() -> Column:
    return F.col("transaction_id").isNotNull()


def is_approved() -> Column:
    return is_ours() & (F.col("status") == "approved")


def is_open_clearing_row() -> Column:
    """A clearing row the acquirer will settle: approved and not reversed."""
    return ~is_ours() & F.col("reversed_at").isNull()


def is_clearing_row() -> Column:
    return ~is_ours()


def is_acquirer_timeout() -> Column:
    """Declined because the acquirer's answer never came (the 0200 in doubt, §2.9)."""
    return (F.col("status") == "declined") & (F.col("decline_reason") == "acquirer_timeout")


def _signed(amount: Column, is_refund: Column) -> Column:
    return F.when(is_refund, -amount).otherwise(amount)


# ------------------------------------------------------------------------ sides
def our_side(transactions: DataFrame) -> DataFrame:
    """Our transactions that carry an rrn, one column set shared with the clearing side."""
    return transactions.where(F.col("rrn").isNotNull()).select(
        "rrn",
        *TXN_KEY,
        F.to_date("created_at").alias("event_date"),
        "status",
        _signed(F.col("amount"), F.col("type") == "refund").alias("amount"),
        "currency",
        F.lit(None).cast("timestamp").alias("approved_at"),
        F.lit(None).cast("timestamp").alias("reversed_at"),
    )


def clearing_side(clearing: DataFrame) -> DataFrame:
    """The clearing rows (with ``clearing_date``) in the same columns."""
    is_refund = F.col("processing_code").startswith(REFUND_PREFIX)
    return clearing.select(
        "rrn",
        "merchant_id",
        F.lit(None).cast("string").alias("transaction_id"),
        F.col("clearing_date").alias("event_date"),
        F.lit(None).cast("string").alias("status"),
        _signed(F.col("amount"), is_refund).alias("amount"),
        "currency",
        "approved_at",
        "reversed_at",
    )


def by_rrn(transactions: DataFrame, clearing: DataFrame) -> DataFrame:
    """One row per rrn: our approved transaction (``ours``, the earliest if a copy or a
    collision gives two), any transaction of ours (``any_ours``), the clearing rows
    (``rows``), the unreversed ones (``open_rows``, the first as ``first_open``, their
    signed sum ``open_amount``), and the latest clearing date and its merchant."""
    ours = F.struct("event_date", "transaction_id", "merchant_id", "amount", "currency")
    row = F.struct("approved_at", "event_date", "merchant_id", "amount", "currency")
    return (
        our_side(transactions)
        .unionByName(clearing_side(clearing))
        .groupBy("rrn")
        .agg(
            F.min(F.when(is_approved(), ours)).alias("ours"),
            F.min(F.when(is_ours(), ours)).alias("any_ours"),
            F.count_if(is_clearing_row()).alias("rows"),
            F.count_if(is_open_clearing_row()).alias("open_rows"),
            F.min(F.when(is_open_clearing_row(), row)).alias("first_open"),
            F.sum(F.when(is_open_clearing_row(), F.col("amount"))).alias("open_amount"),
            F.max(F.when(is_clearing_row(), F.struct("event_date", "merchant_id"))).alias("last"),
        )
    )


# --------------------------------------------------------------------- outcomes
def _outcome(kind: Column, day: str, merchant: str, transaction: str, clearing: Column) -> Column:
    return F.struct(
        F.col(day).alias("event_date"),
        F.col(merchant).alias("merchant_id"),
        kind.alias("kind"),
        F.col("rrn").alias("rrn"),
        F.col(f"{transaction}.transaction_id").alias("transaction_id"),
        F.col(f"{transaction}.amount").alias("amount"),
        F.coalesce(F.col(f"{transaction}.currency"), F.col("first_open.currency")).alias(
            "currency"
        ),
        clearing.cast("long").alias("clearing_amount"),
    )


def outcomes(rrns: DataFrame, clearing_days: Sequence[date]) -> DataFrame:
    """Each rrn's match or exceptions, one row each (``EXCEPTION_COLUMNS``; kind
    ``matched`` for a match)."""
    has_open = F.col("open_rows") > 0
    has_ours = F.col("ours").isNotNull()
    reconcilable = has_ours & F.col("ours.event_date").isin(list(clearing_days))
    agrees = (F.col("first_open.amount") == F.col("ours.amount")) & (
        F.col("first_open.currency") == F.col("ours.currency")
    )
    our_kind = (
        F.when(~has_open, F.lit("ours_only"))
        .when(agrees, F.lit(MATCHED))
        .otherwise(F.lit("amount_mismatch"))
    )
    first_open_amount = F.when(has_open, F.col("first_open.amount"))
    ours_outcome = F.when(
        reconcilable,
        _outcome(our_kind, "ours.event_date", "ours.merchant_id", "ours", first_open_amount),
    )
    charged_without_sale = F.when(
        has_open & ~has_ours,
        _outcome(
            F.lit("acquirer_only"),
            "first_open.event_date",
            "first_open.merchant_id",
            "any_ours",
            F.col("first_open.amount"),
        ),
    )
    duplicated = F.when(
        F.col("rows") > 1,
        _outcome(
            F.lit("duplicate_rrn"),
            "last.event_date",
            "last.merchant_id",
            "any_ours",
            F.col("open_amount"),
        ),
    )
    found = F.filter(
        F.array(ours_outcome, charged_without_sale, duplicated), lambda o: o.isNotNull()
    )
    return rrns.select(F.explode(found).alias("o")).select("o.*").select(*EXCEPTION_COLUMNS)


def is_exception() -> Column:
    return F.col("kind") != MATCHED


def settlement_exceptions(found: DataFrame, *, start: date, end: date) -> DataFrame:
    """One row per exception within the range, the money first: by day, merchant, kind."""
    return (
        in_range(found.where(is_exception()), start=start, end=end)
        .orderBy("event_date", "merchant_id", "kind", "rrn")
        .select(*EXCEPTION_COLUMNS)
    )


def settlement_recon(
    found: DataFrame, clearing_days: Sequence[date], *, start: date, end: date
) -> DataFrame:
    """Per event_date × merchant: matched, matched_amount and each exception kind's count;
    the fleet row ``ALL`` for every day of the range that has a clearing file."""
    is_matched = F.col("kind") == MATCHED
    counts = [
        F.count_if(is_matched).cast("long").alias("matched"),
        F.sum(F.when(is_matched, F.col("amount")).otherwise(F.lit(0)))
        .cast("long")
        .alias("matched_amount"),
        *[F.count_if(F.col("kind") == kind).cast("long").alias(kind) for kind in EXCEPTION_KINDS],
    ]
    days = [day for day in clearing_days if start <= day <= end]
    spine = found.sparkSession.createDataFrame(
        [(day, FLEET) for day in days], "event_date date, merchant_id string"
    )
    is_fleet = F.col("merchant_id") == FLEET
    return (
        in_range(grouped_by_merchant(found, counts), start=start, end=end)
        .join(spine, on=["event_date", "merchant_id"], how="full")
        .fillna(0, subset=RECON_COLUMNS[2:])
        .orderBy("event_date", is_fleet.asc(), "merchant_id")
        .select(*RECON_COLUMNS)
    )
