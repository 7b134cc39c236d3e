"""The daily audit's metrics (SPEC §5) as pure ``DataFrame → DataFrame`` transforms.

Inputs are the lake's three tables (``analytics.schemas``); no transform reads or writes
anything, and each ends in an explicit ``select``: its output contract. The attribution
rules, once, in code:

- **event metrics** (create_requests, duplicate_requests, lookup_found_rate, key_reused,
  create latency) count on each event's own UTC ``event_date``;
- **key metrics** (transactions, retried, unseen attempts and link loss, in-doubt,
  resolution time, aborted, expired, reversed) count on the UTC date of the key's first
  event of any endpoint, computed from *all* the key's events in the lake whatever their
  date; a key is ``(merchant_id, idempotency_key)``;
- **suspected double charges** count on the later transaction's ``created_at`` date;
- **exactly-once violations** count on the transaction's date (a charge without a
  transaction: on the entry's date); ledger entries belong to their transaction whatever
  the entry's own date.

The caller passes the whole lake and the reporting range: rows are filtered to the range at
the end, never before, so a key that started the day before the range is still whole.
"""

from __future__ import annotations

from datetime import date

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StructType, TimestampType

from analytics.metrics import (
    COUNT_COLUMNS,
    DOUBLE_CHARGE_COLUMNS,
    FLEET,
    LINK_LOSS_COLUMNS,
    NETWORK_COLUMNS,
    RANKING_COLUMNS,
    SUMMARY_COLUMNS,
    TREND_COLUMNS,
    VIOLATION_COLUMNS,
)

KEY = ["merchant_id", "idempotency_key"]
SUSPECT_WINDOW_MICROS = 120 * 1_000_000
RESOLVING_OUTCOMES = ["found", "created", "replayed", "aborted", "fenced"]
UNKNOWN_NETWORK = "unknown"
NETWORK_COUNTS = [
    "create_requests",
    "duplicate_requests",
    "lookups_found",
    "lookups_answered",
    "transactions",
    "retried_transactions",
    "unseen_attempts",
    "received_attempts",
    "in_doubt_transactions",
]
BY_MERCHANT = ["merchant_id"]
ZERO_WHEN_ABSENT = [*COUNT_COLUMNS, "lookups_found", "lookups_answered", "received_attempts"]


# ----------------------------------------------------------------- named conditions
# Functions, not module constants: a Column needs the active session to exist.
def is_create() -> Column:
    return F.col("endpoint") == "create"


def is_lookup() -> Column:
    return F.col("endpoint") == "lookup"


def is_created() -> Column:
    return is_create() & (F.col("outcome") == "created")


def is_duplicate() -> Column:
    return is_create() & F.col("outcome").isin("replayed", "in_progress")


def is_key_reused() -> Column:
    return is_create() & (F.col("outcome") == "key_reused")


def is_counted_attempt() -> Column:
    return is_create() & (F.col("outcome") != "key_reused")


def is_numbered_attempt() -> Column:
    """A counted create event that says which attempt it was (the SDK's ``attempt``)."""
    return is_counted_attempt() & F.col("attempt").isNotNull()


def is_lookup_found() -> Column:
    return is_lookup() & (F.col("outcome") == "found")


def is_lookup_answered() -> Column:
    return is_lookup() & F.col("outcome").isin("found", "not_found")


def is_abort_aborted() -> Column:
    return (F.col("endpoint") == "abort") & (F.col("outcome") == "aborted")


def is_create_expired() -> Column:
    return is_create() & (F.col("outcome") == "expired")


def is_reversal_reversed() -> Column:
    return (F.col("endpoint") == "reversal") & (F.col("outcome") == "reversed")


def is_resolving() -> Column:
    return F.col("outcome").isin(*RESOLVING_OUTCOMES)


def is_approved_purchase() -> Column:
    return (F.col("type") == "purchase") & (F.col("status") == "approved")


def is_charge() -> Column:
    return F.col("kind") == "charge"


def _rate(numerator: str, denominator: str | Column) -> Column:
    """A fraction in [0, 1]; 0 when the denominator is 0."""
    below = F.col(denominator) if isinstance(denominator, str) else denominator
    return F.when(below > 0, F.col(numerator) / below).otherwise(F.lit(0.0))


def _link_loss_rate() -> Column:
    """unseen ÷ (unseen + received): the share of the attempts sent that never arrived."""
    return _rate("unseen_attempts", F.col("unseen_attempts") + F.col("received_attempts"))


def _seconds_between(later: str, earlier: str) -> Column:
    return (F.unix_micros(F.col(later)) - F.unix_micros(F.col(earlier))) / F.lit(1_000_000.0)


def in_range(df: DataFrame, *, start: date, end: date) -> DataFrame:
    """Rows whose ``event_date`` is within [start, end] (inclusive)."""
    return df.where(F.col("event_date").between(F.lit(start), F.lit(end)))


# ------------------------------------------------------------------------ inputs
def conform(df: DataFrame, schema: StructType) -> DataFrame:
    """The contract's columns with the contract's types, whatever wrote the Parquet.

    Missing columns become nulls, integer widths and naive timestamps are cast (the
    session clock is UTC), and nanosecond timestamps (read as longs) become microseconds.
    """
    columns = []
    for field in schema.fields:
        if field.name not in df.columns:
            columns.append(F.lit(None).cast(field.dataType).alias(field.name))
            continue
        source = df.schema[field.name].dataType
        if isinstance(field.dataType, TimestampType) and isinstance(source, LongType):
            column = F.timestamp_micros(F.expr(f"`{field.name}` div 1000"))
        else:
            column = F.col(field.name).cast(field.dataType)
        columns.append(column.alias(field.name))
    return df.select(*columns)


def drop_duplicate_rows(df: DataFrame, keys: list[str]) -> DataFrame:
    """One row per ``keys`` (a row's identity): a copy of a row read twice counts once."""
    return df.dropDuplicates(keys)


def with_event_date(df: DataFrame, timestamp: str) -> DataFrame:
    """Adds ``event_date``: the UTC date of ``timestamp`` (the lake's partition rule)."""
    return df.withColumn("event_date", F.to_date(F.col(timestamp)))


# ---------------------------------------------------------------------- per key
def key_facts(events: DataFrame) -> DataFrame:
    """One row per (merchant_id, idempotency_key) from all its events in the lake."""
    first_lookup_ts = F.min(F.when(is_lookup(), F.col("ts"))).over(Window.partitionBy(*KEY))
    resolved_after_lookup = is_resolving() & (F.col("ts") >= F.col("first_lookup_ts"))
    has_terminal = F.col("terminal_id").isNotNull()
    has_network = is_create() & F.col("network").isNotNull()
    facts = (
        events.withColumn("first_lookup_ts", first_lookup_ts)
        .groupBy(*KEY)
        .agg(
            F.min("ts").alias("first_ts"),
            F.min(F.when(is_create(), F.col("ts"))).alias("first_create_ts"),
            F.min(F.when(resolved_after_lookup, F.col("ts"))).alias("resolved_ts"),
            F.bool_or(is_created()).alias("is_transaction"),
            F.count_if(is_counted_attempt()).alias("create_attempts"),
            F.count_if(is_numbered_attempt()).alias("numbered_attempts"),
            F.max(F.when(is_numbered_attempt(), F.col("attempt"))).alias("highest_attempt"),
            F.count_if(is_lookup()).alias("lookups"),
            F.bool_or(is_abort_aborted()).alias("aborted"),
            F.bool_or(is_create_expired()).alias("expired"),
            F.bool_or(is_reversal_reversed()).alias("reversed"),
            F.min(F.when(has_terminal, F.struct("ts", "terminal_id")))
            .getField("terminal_id")
            .alias("terminal_id"),
            F.min(F.when(has_network, F.struct("ts", "network")))
            .getField("network")
            .alias("network"),
        )
    )
    is_transaction = F.col("is_transaction")
    is_in_doubt = is_transaction & (F.col("lookups") >= 1)
    highest = F.coalesce(F.col("highest_attempt"), F.lit(0))
    sent_more_than_once = (F.col("create_attempts") >= 2) | (highest >= 2)
    unseen = F.greatest(highest.cast("long") - F.col("numbered_attempts"), F.lit(0).cast("long"))
    zero = F.lit(0).cast("long")
    return facts.select(
        *KEY,
        F.to_date(F.col("first_ts")).alias("event_date"),
        F.col("terminal_id"),
        F.coalesce(F.col("network"), F.lit(UNKNOWN_NETWORK)).alias("network"),
        is_transaction.alias("is_transaction"),
        (is_transaction & sent_more_than_once).alias("is_retried"),
        F.when(is_transaction, F.col("numbered_attempts"))
        .otherwise(zero)
        .alias("received_attempts"),
        F.when(is_transaction, unseen).otherwise(zero).alias("unseen_attempts"),
        is_in_doubt.alias("is_in_doubt"),
        F.when(is_in_doubt, _seconds_between("resolved_ts", "first_create_ts")).alias(
            "resolution_s"
        ),
        F.col("aborted"),
        F.col("expired"),
        F.col("reversed"),
    )


def _grouped(df: DataFrame, dims: list[str], aggregates: list[Column]) -> DataFrame:
    """``aggregates`` per event_date × dims. With ``dims == BY_MERCHANT`` a rollup adds the
    fleet row (merchant_id ``ALL``) in the same pass: computed from all the day's rows,
    never from the merchants' results."""
    if dims != BY_MERCHANT:
        return df.groupBy("event_date", *dims).agg(*aggregates)
    levels = [F.grouping("event_date").alias("day_total"), F.grouping("merchant_id").alias("fleet")]
    is_fleet = F.col("fleet") == 1
    return (
        df.rollup("event_date", "merchant_id")
        .agg(*aggregates, *levels)
        .where(F.col("day_total") == 0)
        .withColumn("merchant_id", F.when(is_fleet, F.lit(FLEET)).otherwise(F.col("merchant_id")))
    )


def key_counts(keys: DataFrame, dims: list[str]) -> DataFrame:
    """Key metrics per event_date × dims (over ``key_facts``)."""
    aggregates = [
        F.count_if(F.col("is_transaction")).alias("transactions"),
        F.count_if(F.col("is_retried")).alias("retried_transactions"),
        F.sum("unseen_attempts").alias("unseen_attempts"),
        F.sum("received_attempts").alias("received_attempts"),
        F.count_if(F.col("is_in_doubt")).alias("in_doubt_transactions"),
        F.count_if(F.col("aborted")).alias("aborted"),
        F.count_if(F.col("expired")).alias("expired"),
        F.count_if(F.col("reversed")).alias("reversed"),
        F.percentile(F.col("resolution_s"), [0.5, 0.95]).alias("resolution"),
    ]
    return _grouped(keys, dims, aggregates).select(
        "event_date",
        *dims,
        "transactions",
        "retried_transactions",
        "unseen_attempts",
        "received_attempts",
        "in_doubt_transactions",
        "aborted",
        "expired",
        "reversed",
        F.col("resolution").getItem(0).alias("in_doubt_resolution_p50_s"),
        F.col("resolution").getItem(1).alias("in_doubt_resolution_p95_s"),
    )


# -------------------------------------------------------------------- per event
def event_counts(events: DataFrame, dims: list[str]) -> DataFrame:
    """Event metrics per event_date × dims (events carry ``event_date``)."""
    aggregates = [
        F.count_if(is_create()).alias("create_requests"),
        F.count_if(is_duplicate()).alias("duplicate_requests"),
        F.count_if(is_lookup_found()).alias("lookups_found"),
        F.count_if(is_lookup_answered()).alias("lookups_answered"),
        F.count_if(is_key_reused()).alias("key_reused"),
        F.percentile(F.when(is_create(), F.col("latency_ms")), [0.5, 0.95, 0.99]).alias("latency"),
    ]
    return _grouped(events, dims, aggregates).select(
        "event_date",
        *dims,
        "create_requests",
        "duplicate_requests",
        "lookups_found",
        "lookups_answered",
        "key_reused",
        F.col("latency").getItem(0).alias("create_p50_ms"),
        F.col("latency").getItem(1).alias("create_p95_ms"),
        F.col("latency").getItem(2).alias("create_p99_ms"),
    )


# ------------------------------------------------------------- ledger and money
def suspected_double_charges(transactions: DataFrame) -> DataFrame:
    """Consecutive approved purchases of one (merchant, terminal, card, amount, currency)
    at most 120 s apart (inclusive) under different keys; dated by the later one."""
    group = ["merchant_id", "terminal_id", "card_fingerprint", "amount", "currency"]
    ordered = Window.partitionBy(*group).orderBy("created_at", "transaction_id")
    pairs = (
        transactions.where(is_approved_purchase())
        .withColumn("first_transaction_id", F.lag("transaction_id").over(ordered))
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
            "merchant_id",
            "terminal_id",
            "card_fingerprint",
            "amount",
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

    One join and one window over its output (already partitioned by transaction).
    """
    txn_key = ["merchant_id", "transaction_id"]
    known = transactions.groupBy(*txn_key).agg(F.min("created_at").alias("txn_created_at"))
    per_transaction = Window.partitionBy(*txn_key)
    matched = (
        ledger_entries.where(is_charge())
        .join(known, on=txn_key, how="left")
        .withColumn("charge_entries", F.count(F.lit(1)).over(per_transaction))
        .withColumn("nth", F.row_number().over(per_transaction.orderBy("entry_id")))
    )
    is_orphan = F.col("txn_created_at").isNull()
    is_doubled = ~is_orphan & (F.col("charge_entries") > 1) & (F.col("nth") == 1)
    return (
        matched.where(is_orphan | is_doubled)
        .select(
            F.to_date(F.coalesce(F.col("txn_created_at"), F.col("created_at"))).alias("event_date"),
            *txn_key,
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


def _count_by_day(detail: DataFrame, name: str) -> DataFrame:
    counted = _grouped(detail, BY_MERCHANT, [F.count(F.lit(1)).alias(name)])
    return counted.select("event_date", "merchant_id", name)


# ---------------------------------------------------------------------- outputs
def _with_rates(df: DataFrame) -> DataFrame:
    return (
        df.withColumn("retry_rate", _rate("retried_transactions", "transactions"))
        .withColumn("link_loss_rate", _link_loss_rate())
        .withColumn("duplicate_rate", _rate("duplicate_requests", "create_requests"))
        .withColumn("in_doubt_rate", _rate("in_doubt_transactions", "transactions"))
        .withColumn("lookup_found_rate", _rate("lookups_found", "lookups_answered"))
    )


def day_spine(events: DataFrame, *, start: date, end: date) -> DataFrame:
    """(day, ``ALL``) for every day of [start, end]: a day without events still has its
    fleet row."""
    days = F.sequence(F.lit(start), F.lit(end))
    return events.sparkSession.range(1).select(
        F.explode(days).alias("event_date"), F.lit(FLEET).alias("merchant_id")
    )


def daily_summary(
    events: DataFrame,
    keys: DataFrame,
    suspects: DataFrame,
    violations: DataFrame,
    *,
    start: date,
    end: date,
) -> DataFrame:
    """One row per event_date × merchant_id with activity, plus the fleet row ``ALL`` for
    every day of the range (recomputed from all the day's events and keys, never averaged).

    ``events`` carry ``event_date``; ``keys`` come from ``key_facts``; ``suspects`` and
    ``violations`` are the detail tables of the whole lake.
    """
    on = ["event_date", "merchant_id"]
    joined = (
        event_counts(events, BY_MERCHANT)
        .join(key_counts(keys, BY_MERCHANT), on=on, how="full")
        .join(_count_by_day(suspects, "suspected_double_charges"), on=on, how="full")
        .join(_count_by_day(violations, "exactly_once_violations"), on=on, how="full")
        .join(day_spine(events, start=start, end=end), on=on, how="full")
    )
    is_fleet = F.col("merchant_id") == FLEET
    return (
        in_range(joined, start=start, end=end)
        .fillna(0, subset=ZERO_WHEN_ABSENT)
        .transform(_with_rates)
        .orderBy("event_date", is_fleet.asc(), "merchant_id")
        .select(*SUMMARY_COLUMNS)
    )


def terminal_ranking(keys: DataFrame, *, start: date, end: date) -> DataFrame:
    """Per event_date × merchant, terminals by retry rate (the flakiest links first)."""
    by_terminal = (
        keys.where(F.col("is_transaction"))
        .groupBy("event_date", "merchant_id", "terminal_id")
        .agg(
            F.count(F.lit(1)).alias("transactions"),
            F.count_if(F.col("is_retried")).alias("retried_transactions"),
        )
        .withColumn("retry_rate", _rate("retried_transactions", "transactions"))
    )
    flakiest_first = Window.partitionBy("event_date", "merchant_id").orderBy(
        F.col("retry_rate").desc(),
        F.col("retried_transactions").desc(),
        F.col("transactions").desc(),
        F.col("terminal_id").asc_nulls_last(),
    )
    return (
        in_range(by_terminal, start=start, end=end)
        .withColumn("rank", F.row_number().over(flakiest_first))
        .orderBy("event_date", "merchant_id", "rank")
        .select(*RANKING_COLUMNS)
    )


def network_rates(events: DataFrame, keys: DataFrame, *, start: date, end: date) -> DataFrame:
    """The fleet's rates per event_date × network: event metrics under each event's own
    network, key metrics under the key's (its earliest create event's that carries one);
    null → ``unknown``. A row per (day, network) with an event or a transaction."""
    by_event = events.withColumn("network", F.coalesce(F.col("network"), F.lit(UNKNOWN_NETWORK)))
    on = ["event_date", "network"]
    transaction_keys = keys.where(F.col("is_transaction"))
    joined = (
        event_counts(by_event, ["network"])
        .join(key_counts(transaction_keys, ["network"]), on=on, how="full")
        .fillna(0, subset=NETWORK_COUNTS)
        .transform(_with_rates)
    )
    return in_range(joined, start=start, end=end).orderBy(*on).select(*NETWORK_COLUMNS)


def daily_trend(summary: DataFrame) -> DataFrame:
    """The fleet rows of ``daily_summary``: one row per day of the range."""
    return summary.where(F.col("merchant_id") == FLEET).orderBy("event_date").select(*TREND_COLUMNS)


def terminal_link_loss(keys: DataFrame, *, start: date, end: date) -> DataFrame:
    """Link loss per event_date × merchant × terminal × the key's network, over keys
    counted in transactions (an extra output: the report sums it over the range)."""
    dims = ["event_date", "merchant_id", "terminal_id", "network"]
    by_terminal = (
        keys.where(F.col("is_transaction"))
        .groupBy(*dims)
        .agg(
            F.count(F.lit(1)).alias("transactions"),
            F.sum("received_attempts").alias("received_attempts"),
            F.sum("unseen_attempts").alias("unseen_attempts"),
        )
        .withColumn("link_loss_rate", _link_loss_rate())
    )
    return (
        in_range(by_terminal, start=start, end=end)
        .orderBy(*[F.col(d).asc_nulls_last() for d in dims])
        .select(*LINK_LOSS_COLUMNS)
    )
