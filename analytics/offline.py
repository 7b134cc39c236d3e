"""The audit of offline selling (issue 16) and of the duplicate guard (issue 17) as pure
``DataFrame → DataFrame`` transforms, each ending in an explicit ``select``.

What the server — hence the lake — can know: a terminal's offline sale reaches the server
only when the terminal forwards it (an *advice*, ``transactions.offline``), with the moment
it was sold (``captured_at``). A sale still stored in a terminal has left no row anywhere
on the server, so "stored but not forwarded at day end" cannot be measured here; what is
measured instead is ``forwarded_after_day_end``: offline transactions forwarded on a later
UTC day than the one they were sold on (they were stored at the end of their sale's day).

- ``transaction_cube``: the transactions (copies dropped) summed per event_date (of
  ``created_at``) × merchant × terminal × currency, with the forward delays of the offline
  ones kept as a list for exact percentiles — a few thousand rows;
- ``offline_summary`` / ``offline_terminals``: per merchant (and the fleet ``ALL``) / per
  terminal, within one currency (an amount is only summed within its currency);
- ``duplicate_guard``: blocks (create events ``rejected`` with ``http_status`` 409, on the
  event's own date, from the event cube) and overrides (transactions with
  ``duplicate_override``, on the transaction's date).

A partition written before lake schema 2 has the three columns null: read as not offline
and not overridden (the audit says so: ``analytics.lake_health``'s ``older_schema`` note).
"""

from __future__ import annotations

from datetime import date

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from analytics.metrics import (
    FLEET,
    GUARD_COLUMNS,
    OFFLINE_COLUMNS,
    OFFLINE_TERMINAL_COLUMNS,
)
from analytics.settlement import is_acquirer_timeout
from analytics.transforms import grouped_by_merchant, in_range, percentile_of_sorted

TXN_KEY = ["merchant_id", "transaction_id"]
TXN_CUBE = ["event_date", "merchant_id", "terminal_id", "currency"]
COUNTS = [
    "transactions",
    "offline_transactions",
    "offline_declined",
    "offline_amount_at_risk",
    "forwarded_after_day_end",
    "duplicates_overridden",
]


def is_offline() -> Column:
    """A forwarded offline advice (null in a partition older than the column: not one)."""
    return F.coalesce(F.col("offline"), F.lit(False))


def is_offline_declined() -> Column:
    return is_offline() & (F.col("status") == "declined")


def is_forwarded_after_day_end() -> Column:
    """Sold on an earlier UTC day than the server processed it: stored overnight."""
    return is_offline() & (F.to_date(F.col("captured_at")) < F.to_date(F.col("created_at")))


def is_overridden() -> Column:
    return F.coalesce(F.col("duplicate_override"), F.lit(False))


def _forward_delay_s() -> Column:
    """created_at − captured_at of an offline transaction, in seconds (not clamped: a
    terminal clock ahead within the allowed skew gives a small negative delay)."""
    micros = F.unix_micros(F.col("created_at")) - F.unix_micros(F.col("captured_at"))
    return F.when(is_offline() & F.col("captured_at").isNotNull(), micros / F.lit(1_000_000.0))


def transaction_cube(transactions: DataFrame) -> DataFrame:
    """Transactions (one row per ``(merchant_id, transaction_id)``, copies dropped) summed
    per event_date × merchant × terminal × currency; ``delays``: the forward delays; also
    ``acquirer_timeouts``, ``approved`` and ``approved_without_rrn`` (not reconcilable)."""
    unique = transactions.dropDuplicates(TXN_KEY)
    at_risk = F.when(is_offline_declined(), F.col("amount")).otherwise(F.lit(0))
    return unique.groupBy(
        F.to_date(F.col("created_at")).alias("event_date"), "merchant_id", "terminal_id", "currency"
    ).agg(
        F.count(F.lit(1)).alias("transactions"),
        F.count_if(is_offline()).alias("offline_transactions"),
        F.count_if(is_offline_declined()).alias("offline_declined"),
        F.sum(at_risk).cast("long").alias("offline_amount_at_risk"),
        F.count_if(is_forwarded_after_day_end()).alias("forwarded_after_day_end"),
        F.count_if(is_overridden()).alias("duplicates_overridden"),
        F.collect_list(_forward_delay_s()).alias("delays"),
        # for daily_summary and the settlement reconciliation's notes (analytics.settlement)
        F.count_if(is_acquirer_timeout()).alias("acquirer_timeouts"),
        F.count_if(F.col("status") == "approved").alias("approved"),
        F.count_if((F.col("status") == "approved") & F.col("rrn").isNull()).alias(
            "approved_without_rrn"
        ),
    )


def _rate(numerator: str, denominator: str) -> Column:
    return F.when(F.col(denominator) > 0, F.col(numerator) / F.col(denominator)).otherwise(0.0)


def _metrics(df: DataFrame) -> DataFrame:
    """Rates and delay statistics from summed counts and a sorted ``delays`` array."""
    delays = F.col("delays")
    return (
        df.withColumn("offline_rate", _rate("offline_transactions", "transactions"))
        .withColumn("offline_decline_rate", _rate("offline_declined", "offline_transactions"))
        .withColumn("forward_delay_p50_s", percentile_of_sorted(delays, 0.5))
        .withColumn("forward_delay_p95_s", percentile_of_sorted(delays, 0.95))
        .withColumn("forward_delay_max_s", F.array_max(delays))
    )


def _sums() -> list[Column]:
    return [F.sum(name).cast("long").alias(name) for name in COUNTS]


def _all_delays() -> Column:
    return F.array_sort(F.flatten(F.collect_list("delays"))).alias("delays")


def offline_summary(cube: DataFrame, *, start: date, end: date) -> DataFrame:
    """Per event_date × merchant × currency with a transaction, plus the fleet ``ALL`` per
    event_date × currency (its rates and percentiles from all the fleet's rows)."""
    levels = [F.grouping("currency").alias("by_currency"), F.grouping("merchant_id").alias("fleet")]
    rolled = (
        cube.rollup("event_date", "currency", "merchant_id")
        .agg(*_sums(), _all_delays(), *levels, F.grouping("event_date").alias("day_total"))
        .where((F.col("day_total") == 0) & (F.col("by_currency") == 0))
        .withColumn(
            "merchant_id",
            F.when(F.col("fleet") == 1, F.lit(FLEET)).otherwise(F.col("merchant_id")),
        )
    )
    is_fleet = F.col("merchant_id") == FLEET
    return (
        in_range(rolled, start=start, end=end)
        .transform(_metrics)
        .orderBy("event_date", is_fleet.asc(), "merchant_id", "currency")
        .select(*OFFLINE_COLUMNS)
    )


def offline_terminals(cube: DataFrame, *, start: date, end: date) -> DataFrame:
    """Per event_date × merchant × terminal × currency, terminals with an offline sale."""
    sorted_ = cube.withColumn("delays", F.array_sort("delays"))
    return (
        in_range(sorted_.where(F.col("offline_transactions") > 0), start=start, end=end)
        .transform(_metrics)
        .orderBy("event_date", "merchant_id", F.col("terminal_id").asc_nulls_last(), "currency")
        .select(*OFFLINE_TERMINAL_COLUMNS)
    )


def duplicate_guard(event_cube: DataFrame, cube: DataFrame, *, start: date, end: date) -> DataFrame:
    """Per event_date × merchant with a block or an override, plus ``ALL`` for every day of
    the range. ``event_cube`` carries ``duplicates_blocked`` (``transforms.event_cube``)."""
    blocked = grouped_by_merchant(
        event_cube, [F.sum("duplicates_blocked").cast("long").alias("duplicates_blocked")]
    )
    overridden = grouped_by_merchant(
        cube, [F.sum("duplicates_overridden").cast("long").alias("duplicates_overridden")]
    )
    days = F.sequence(F.lit(start), F.lit(end))
    spine = event_cube.sparkSession.range(1).select(
        F.explode(days).alias("event_date"), F.lit(FLEET).alias("merchant_id")
    )
    day_merchant = ["event_date", "merchant_id"]
    is_fleet = F.col("merchant_id") == FLEET
    joined = (
        blocked.join(overridden, on=day_merchant, how="full")
        .join(spine, on=day_merchant, how="full")
        .fillna(0, subset=["duplicates_blocked", "duplicates_overridden"])
    )
    something = (F.col("duplicates_blocked") + F.col("duplicates_overridden")) > 0
    return (
        in_range(joined.where(is_fleet | something), start=start, end=end)
        .orderBy("event_date", is_fleet.asc(), "merchant_id")
        .select(*GUARD_COLUMNS)
    )
