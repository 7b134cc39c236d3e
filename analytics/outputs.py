"""The audit's output tables (contract §5) from the small tables of ``analytics.transforms``
(``Cubes``) and the money checks (``analytics.money``): sums over a few thousand rows, each
ending in an explicit ``select`` — its output contract.

Rates are fractions in [0, 1], 0 when the denominator is 0, always recomputed from the
row's own totals (the fleet row's from the fleet's, a network's from the network's).
"""

from __future__ import annotations

from datetime import date

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from analytics.metrics import (
    COUNT_COLUMNS,
    FLEET,
    LINK_LOSS_COLUMNS,
    NETWORK_COLUMNS,
    RANKING_COLUMNS,
    SUMMARY_COLUMNS,
    TREND_COLUMNS,
)
from analytics.transforms import Cubes, grouped_by_merchant, in_range

KEY_SUMS = [
    "transactions",
    "retried_transactions",
    "unseen_attempts",
    "received_attempts",
    "in_doubt_transactions",
    "aborted",
    "expired",
    "reversed",
]
EVENT_SUMS = [
    "create_requests",
    "duplicate_requests",
    "lookups_found",
    "lookups_answered",
    "key_reused",
]
ZERO_WHEN_ABSENT = [*COUNT_COLUMNS, "lookups_found", "lookups_answered", "received_attempts"]
DAY_MERCHANT = ["event_date", "merchant_id"]
DAY_NETWORK = ["event_date", "network"]


def _rate(numerator: str, denominator: str | Column) -> Column:
    """A fraction in [0, 1]; 0 when the denominator is 0."""
    below = F.col(denominator) if isinstance(denominator, str) else denominator
    return F.when(below > 0, F.col(numerator) / below).otherwise(F.lit(0.0))


def _link_loss_rate() -> Column:
    """unseen ÷ (unseen + received): the share of the attempts sent that never arrived."""
    return _rate("unseen_attempts", F.col("unseen_attempts") + F.col("received_attempts"))


def _sums(names: list[str]) -> list[Column]:
    return [F.sum(name).cast("long").alias(name) for name in names]


def _with_rates(df: DataFrame) -> DataFrame:
    return (
        df.withColumn("retry_rate", _rate("retried_transactions", "transactions"))
        .withColumn("link_loss_rate", _link_loss_rate())
        .withColumn("duplicate_rate", _rate("duplicate_requests", "create_requests"))
        .withColumn("in_doubt_rate", _rate("in_doubt_transactions", "transactions"))
        .withColumn("lookup_found_rate", _rate("lookups_found", "lookups_answered"))
    )


def _with_timeout_rate(df: DataFrame) -> DataFrame:
    return df.withColumn("acquirer_timeout_rate", _rate("acquirer_timeouts", "transactions"))


# ----------------------------------------------------------------- daily_summary
def merchant_key_counts(key_cube: DataFrame) -> DataFrame:
    """Key metrics per event_date × merchant and the fleet, with the exact in-doubt
    resolution percentiles over the listed times."""
    counts = grouped_by_merchant(key_cube, _sums(KEY_SUMS))
    times = key_cube.select(*DAY_MERCHANT, F.explode("resolutions").alias("resolution_s"))
    resolution = grouped_by_merchant(
        times, [F.percentile(F.col("resolution_s"), [0.5, 0.95]).alias("resolution")]
    ).select(
        *DAY_MERCHANT,
        F.col("resolution").getItem(0).alias("in_doubt_resolution_p50_s"),
        F.col("resolution").getItem(1).alias("in_doubt_resolution_p95_s"),
    )
    return counts.join(resolution, on=DAY_MERCHANT, how="left")


def _count_by_day(detail: DataFrame, name: str) -> DataFrame:
    return grouped_by_merchant(detail, [F.count(F.lit(1)).alias(name)])


def day_spine(df: DataFrame, *, start: date, end: date) -> DataFrame:
    """(day, ``ALL``) for every day of [start, end]: a day without events still has its
    fleet row."""
    days = F.sequence(F.lit(start), F.lit(end))
    return df.sparkSession.range(1).select(
        F.explode(days).alias("event_date"), F.lit(FLEET).alias("merchant_id")
    )


def daily_summary(
    cubes: Cubes,
    suspects: DataFrame,
    violations: DataFrame,
    sold: DataFrame,
    *,
    start: date,
    end: date,
) -> DataFrame:
    """One row per event_date × merchant_id with activity, plus the fleet row ``ALL`` for
    every day of the range (recomputed from all the day's events and keys, never averaged).
    ``suspects`` and ``violations`` are the detail tables of the whole lake; ``sold`` the
    transactions cube (``analytics.offline.transaction_cube``: acquirer_timeouts, on the
    transaction's created_at date)."""
    timeouts = grouped_by_merchant(
        sold.where(F.col("acquirer_timeouts") > 0),
        [F.sum("acquirer_timeouts").cast("long").alias("acquirer_timeouts")],
    )
    joined = (
        grouped_by_merchant(cubes.events, _sums(EVENT_SUMS))
        .join(cubes.latencies, on=DAY_MERCHANT, how="full")
        .join(merchant_key_counts(cubes.keys), on=DAY_MERCHANT, how="full")
        .join(_count_by_day(suspects, "suspected_double_charges"), on=DAY_MERCHANT, how="full")
        .join(_count_by_day(violations, "exactly_once_violations"), on=DAY_MERCHANT, how="full")
        .join(timeouts, on=DAY_MERCHANT, how="full")
        .join(day_spine(cubes.keys, start=start, end=end), on=DAY_MERCHANT, how="full")
    )
    is_fleet = F.col("merchant_id") == FLEET
    return (
        in_range(joined, start=start, end=end)
        .fillna(0, subset=ZERO_WHEN_ABSENT)
        .transform(_with_rates)
        .transform(_with_timeout_rate)
        .orderBy("event_date", is_fleet.asc(), "merchant_id")
        .select(*SUMMARY_COLUMNS)
    )


def daily_trend(summary: DataFrame) -> DataFrame:
    """The fleet rows of ``daily_summary``: one row per day of the range."""
    return summary.where(F.col("merchant_id") == FLEET).orderBy("event_date").select(*TREND_COLUMNS)


# ------------------------------------------------------- terminals and networks
def _transaction_cells(key_cube: DataFrame, dims: list[str]) -> DataFrame:
    """Key sums per ``dims``, only where at least one key is a transaction (a key that is
    not one counts nothing here, so it makes no row)."""
    summed = key_cube.groupBy(*dims).agg(*_sums(KEY_SUMS))
    return summed.where(F.col("transactions") > 0)


def terminal_ranking(key_cube: DataFrame, *, start: date, end: date) -> DataFrame:
    """Per event_date × merchant, terminals by retry rate (the flakiest links first): rank 1
    = highest retry rate, then more retried, then more transactions, then terminal id
    ascending (a key without a terminal last)."""
    by_terminal = _transaction_cells(key_cube, ["event_date", "merchant_id", "terminal_id"])
    flakiest_first = Window.partitionBy(*DAY_MERCHANT).orderBy(
        F.col("retry_rate").desc(),
        F.col("retried_transactions").desc(),
        F.col("transactions").desc(),
        F.col("terminal_id").asc_nulls_last(),
    )
    return (
        in_range(by_terminal, start=start, end=end)
        .withColumn("retry_rate", _rate("retried_transactions", "transactions"))
        .withColumn("rank", F.row_number().over(flakiest_first))
        .orderBy("event_date", "merchant_id", "rank")
        .select(*RANKING_COLUMNS)
    )


def network_rates(cubes: Cubes, *, start: date, end: date) -> DataFrame:
    """The fleet's rates per event_date × network: event metrics under each event's own
    network, key metrics under the key's (its earliest create event's that carries one);
    null → ``unknown``. A row per (day, network) with an event or a transaction."""
    events = cubes.events.groupBy(*DAY_NETWORK).agg(*_sums(EVENT_SUMS))
    keys = _transaction_cells(cubes.keys, DAY_NETWORK)
    joined = (
        events.join(keys, on=DAY_NETWORK, how="full")
        .fillna(0, subset=[*EVENT_SUMS, *KEY_SUMS])
        .transform(_with_rates)
    )
    return in_range(joined, start=start, end=end).orderBy(*DAY_NETWORK).select(*NETWORK_COLUMNS)


def terminal_link_loss(key_cube: DataFrame, *, start: date, end: date) -> DataFrame:
    """Link loss per event_date × merchant × terminal × the key's network, over keys
    counted in transactions (an extra output: the report sums it over the range)."""
    dims = ["event_date", "merchant_id", "terminal_id", "network"]
    by_terminal = _transaction_cells(key_cube, dims).withColumn("link_loss_rate", _link_loss_rate())
    return (
        in_range(by_terminal, start=start, end=end)
        .orderBy(*[F.col(d).asc_nulls_last() for d in dims])
        .select(*LINK_LOSS_COLUMNS)
    )
