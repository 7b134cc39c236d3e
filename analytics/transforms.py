"""The daily audit's metrics (contract §5) as pure ``DataFrame → DataFrame`` transforms.

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

**One pass, small results.** The events are read into two small tables that every output
is computed from (``analytics.outputs``), never into a cached copy of the events:

- ``key_cube``: the key facts (one shuffle of the events, by key, which also drops copied
  events; one sort, no window) summed per event_date × merchant × terminal × network, with
  the in-doubt resolution times kept as a list (exact percentiles later, over a few per
  cent of keys);
- ``event_cube``: event counts per event_date × merchant × network, and
  ``create_latencies``: the exact latency percentiles per day × merchant and fleet (each
  group's values sorted into an array once).

A few thousand rows each, whatever the lake's size.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StructType, TimestampType

from analytics.metrics import FLEET

KEY = ["merchant_id", "idempotency_key"]
# Grouping and sorting by the key's UUID first: its first bytes tell keys apart, so Spark's
# sort settles on 8-byte prefixes instead of comparing whole rows (every key of a merchant
# shares the merchant id's prefix).
KEY_ORDER = ["idempotency_key", "merchant_id"]
KEY_FACT_COLUMNS = [
    *KEY,
    "event_id",
    "ts",
    "terminal_id",
    "endpoint",
    "outcome",
    "attempt",
    "network",
]
CUBE = ["event_date", "merchant_id", "terminal_id", "network"]
RESOLVING_OUTCOMES = ["found", "created", "replayed", "aborted", "fenced"]
UNKNOWN_NETWORK = "unknown"


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


def is_duplicate_blocked() -> Column:
    """The duplicate guard's answer (issue 17): 409 ``suspected_duplicate``, recorded as a
    create ``rejected`` with ``http_status`` 409 — the only create rejection with 409."""
    return is_create() & (F.col("outcome") == "rejected") & (F.col("http_status") == 409)


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


def events_by_key(events: DataFrame) -> DataFrame:
    """The columns ``key_facts`` reads, hash-partitioned by key, copies (same
    ``event_id``) dropped: one shuffle that ``key_facts`` reuses (a copy of an event has
    its key, so it lands in the same partition and the dedup needs no exchange of its
    own)."""
    keyed = events.select(*KEY_FACT_COLUMNS).repartition(*KEY_ORDER)
    return keyed.dropDuplicates([*KEY_ORDER, "event_id"])


def with_event_date(df: DataFrame, timestamp: str) -> DataFrame:
    """Adds ``event_date``: the UTC date of ``timestamp`` (the lake's partition rule)."""
    return df.withColumn("event_date", F.to_date(F.col(timestamp)))


# ---------------------------------------------------------------------- per key
def key_facts(events: DataFrame) -> DataFrame:
    """One row per (merchant_id, idempotency_key) from all its events in the lake.

    One aggregation, no window: the key's resolving moments are kept as a (short) list and
    the first of them at or after the first lookup is picked from it afterwards."""
    has_terminal = F.col("terminal_id").isNotNull()
    has_network = is_create() & F.col("network").isNotNull()
    facts = (
        events.groupBy(*KEY_ORDER)
        .agg(
            F.count(F.lit(1)).alias("events"),
            F.min("ts").alias("first_ts"),
            F.min(F.when(is_create(), F.col("ts"))).alias("first_create_ts"),
            F.min(F.when(is_lookup(), F.col("ts"))).alias("first_lookup_ts"),
            F.collect_list(F.when(is_resolving(), F.col("ts"))).alias("resolving_ts"),
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
        .withColumn(
            "resolved_ts",
            F.array_min(F.filter("resolving_ts", lambda ts: ts >= F.col("first_lookup_ts"))),
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
        F.col("events"),
    )


def key_cube(keys: DataFrame) -> DataFrame:
    """``key_facts`` summed per event_date × merchant × terminal × network (the key's): every
    key metric of every output is a sum over these rows; the resolution times of in-doubt
    transactions are kept as a list for the exact percentiles."""
    return keys.groupBy(*CUBE).agg(
        F.sum("events").alias("events"),
        F.count_if(F.col("is_transaction")).alias("transactions"),
        F.count_if(F.col("is_retried")).alias("retried_transactions"),
        F.sum("unseen_attempts").alias("unseen_attempts"),
        F.sum("received_attempts").alias("received_attempts"),
        F.count_if(F.col("is_in_doubt")).alias("in_doubt_transactions"),
        F.count_if(F.col("aborted")).alias("aborted"),
        F.count_if(F.col("expired")).alias("expired"),
        F.count_if(F.col("reversed")).alias("reversed"),
        F.collect_list("resolution_s").alias("resolutions"),
    )


def grouped_by_merchant(df: DataFrame, aggregates: list[Column]) -> DataFrame:
    """``aggregates`` per event_date × merchant_id, plus the fleet row (merchant_id
    ``ALL``) per day in the same pass (a rollup): computed from all the day's rows, never
    from the merchants' results."""
    levels = [F.grouping("event_date").alias("day_total"), F.grouping("merchant_id").alias("fleet")]
    is_fleet = F.col("fleet") == 1
    return (
        df.rollup("event_date", "merchant_id")
        .agg(*aggregates, *levels)
        .where(F.col("day_total") == 0)
        .withColumn("merchant_id", F.when(is_fleet, F.lit(FLEET)).otherwise(F.col("merchant_id")))
        .drop("day_total", "fleet")
    )


# -------------------------------------------------------------------- per event
def event_cube(events: DataFrame) -> DataFrame:
    """Event counts per event_date × merchant × network (each event's own; null →
    ``unknown``). ``events`` carry ``event_date``."""
    network = F.coalesce(F.col("network"), F.lit(UNKNOWN_NETWORK)).alias("network")
    return events.groupBy("event_date", "merchant_id", network).agg(
        F.count(F.lit(1)).alias("events"),
        F.count_if(is_create()).alias("create_requests"),
        F.count_if(is_duplicate()).alias("duplicate_requests"),
        F.count_if(is_lookup_found()).alias("lookups_found"),
        F.count_if(is_lookup_answered()).alias("lookups_answered"),
        F.count_if(is_key_reused()).alias("key_reused"),
        F.count_if(is_duplicate_blocked()).alias("duplicates_blocked"),
    )


def percentile_of_sorted(values: Column, fraction: float) -> Column:
    """The exact percentile of a sorted array (null when it is empty), interpolating
    linearly between closest ranks: Spark's ``percentile`` to the bit, by its very
    arithmetic ``lower + (position - floor) * (upper - lower)``, position = (n − 1) ×
    fraction."""
    position = (F.size(values) - 1).cast("double") * F.lit(fraction)
    below, above = F.floor(position), F.ceil(position)
    lower = F.element_at(values, below.cast("int") + 1)
    upper = F.element_at(values, above.cast("int") + 1)
    exact = F.when(below == above, lower).otherwise(lower + (position - below) * (upper - lower))
    return F.when(F.size(values) > 0, exact)  # no value (all null): null, as percentile


def create_latencies(events: DataFrame) -> DataFrame:
    """Exact create latency percentiles (p50, p95, p99, linear interpolation) per
    event_date × merchant, and the fleet's (merchant ``ALL``) over all its values.

    Each group's latencies sorted once into an array (lighter than ``percentile``'s map of
    value counts), the percentiles read from it."""
    latencies = F.array_sort(F.collect_list("latency_ms")).alias("latencies")
    sorted_ = F.col("latencies")
    return grouped_by_merchant(events.where(is_create()), [latencies]).select(
        "event_date",
        "merchant_id",
        percentile_of_sorted(sorted_, 0.5).alias("create_p50_ms"),
        percentile_of_sorted(sorted_, 0.95).alias("create_p95_ms"),
        percentile_of_sorted(sorted_, 0.99).alias("create_p99_ms"),
    )


@dataclass(frozen=True)
class Cubes:
    """The small tables every output is computed from (see the module docstring)."""

    keys: DataFrame
    events: DataFrame
    latencies: DataFrame


def cubes(events: DataFrame) -> Cubes:
    """``Cubes`` of ``events`` (with ``event_date``), copies dropped."""
    unique = drop_duplicate_rows(events, [*KEY, "event_id"])
    return Cubes(
        keys=key_cube(key_facts(events_by_key(events))),
        events=event_cube(unique),
        latencies=create_latencies(unique),
    )
