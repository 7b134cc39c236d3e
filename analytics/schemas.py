"""Spark schemas of the lake's tables (contract §5), the input contract of the transforms.

They mirror ``analytics.lake``'s Arrow schemas column for column (a test keeps the two in
step). ``event_date`` is not part of them: it is derived from each row's own UTC timestamp
(``ts`` or ``created_at``), which is by construction the partition's date.
"""

from __future__ import annotations

from pyspark.sql.types import (
    BooleanType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

REQUEST_EVENTS = StructType(
    [
        StructField("event_id", StringType(), False),
        StructField("ts", TimestampType(), False),
        StructField("merchant_id", StringType(), False),
        StructField("terminal_id", StringType(), True),
        StructField("idempotency_key", StringType(), False),
        StructField("endpoint", StringType(), False),
        StructField("outcome", StringType(), False),
        StructField("http_status", IntegerType(), False),
        StructField("attempt", IntegerType(), True),
        StructField("network", StringType(), True),
        StructField("latency_ms", DoubleType(), False),
    ]
)

TRANSACTIONS = StructType(
    [
        StructField("transaction_id", StringType(), False),
        StructField("merchant_id", StringType(), False),
        StructField("terminal_id", StringType(), False),
        StructField("type", StringType(), False),
        StructField("amount", LongType(), False),
        StructField("currency", StringType(), False),
        StructField("card_fingerprint", StringType(), False),
        StructField("status", StringType(), False),
        StructField("created_at", TimestampType(), False),
        StructField("processed_at", TimestampType(), True),
        StructField("reversed_at", TimestampType(), True),
        # lake schema 2 (analytics.lake.ADDED_COLUMNS): null in older partitions
        StructField("offline", BooleanType(), True),
        StructField("captured_at", TimestampType(), True),
        StructField("duplicate_override", BooleanType(), True),
        # lake schema 3: null in older partitions (not reconcilable with the clearing)
        StructField("rrn", StringType(), True),
        StructField("authorization_code", StringType(), True),
        StructField("decline_reason", StringType(), True),
    ]
)

LEDGER_ENTRIES = StructType(
    [
        StructField("entry_id", StringType(), False),
        StructField("transaction_id", StringType(), False),
        StructField("merchant_id", StringType(), False),
        StructField("amount", LongType(), False),
        StructField("currency", StringType(), False),
        StructField("kind", StringType(), False),
        StructField("created_at", TimestampType(), False),
    ]
)

# The acquirer's clearing rows (analytics.clearing), ``clearing/clearing_date=D/``.
CLEARING = StructType(
    [
        StructField("rrn", StringType(), False),
        StructField("stan", StringType(), True),
        StructField("merchant_id", StringType(), True),
        StructField("terminal_id", StringType(), True),
        StructField("processing_code", StringType(), False),
        StructField("amount", LongType(), False),
        StructField("currency", StringType(), False),
        StructField("authorization_code", StringType(), True),
        StructField("approved_at", TimestampType(), False),
        StructField("reversed_at", TimestampType(), True),
    ]
)

TABLES = {
    "request_events": REQUEST_EVENTS,
    "transactions": TRANSACTIONS,
    "ledger_entries": LEDGER_ENTRIES,
}
