"""The audit's output columns, in contract §5's order (the CSV headers are part of the contract).

Plain lists, no Spark: the job, the report and the DuckDB reference all name columns from
here.
"""

from __future__ import annotations

FLEET = "ALL"

# daily_summary: event_date, merchant_id, then the metric table of contract §5 in order.
METRIC_COLUMNS = [
    "transactions",
    "create_requests",
    "retried_transactions",
    "retry_rate",
    "unseen_attempts",
    "link_loss_rate",
    "duplicate_requests",
    "duplicate_rate",
    "in_doubt_transactions",
    "in_doubt_rate",
    "lookup_found_rate",
    "in_doubt_resolution_p50_s",
    "in_doubt_resolution_p95_s",
    "key_reused",
    "aborted",
    "expired",
    "reversed",
    "acquirer_timeouts",
    "acquirer_timeout_rate",
    "suspected_double_charges",
    "exactly_once_violations",
    "create_p50_ms",
    "create_p95_ms",
    "create_p99_ms",
]
SUMMARY_COLUMNS = ["event_date", "merchant_id", *METRIC_COLUMNS]

# Integer metrics: 0 (never null) when nothing happened.
COUNT_COLUMNS = [
    "transactions",
    "create_requests",
    "retried_transactions",
    "unseen_attempts",
    "duplicate_requests",
    "in_doubt_transactions",
    "key_reused",
    "aborted",
    "expired",
    "reversed",
    "acquirer_timeouts",
    "suspected_double_charges",
    "exactly_once_violations",
]
RATE_COLUMNS = [
    "retry_rate",
    "link_loss_rate",
    "duplicate_rate",
    "in_doubt_rate",
    "lookup_found_rate",
    "acquirer_timeout_rate",
]

RANKING_COLUMNS = [
    "event_date",
    "merchant_id",
    "terminal_id",
    "transactions",
    "retried_transactions",
    "retry_rate",
    "rank",
]

DOUBLE_CHARGE_COLUMNS = [
    "event_date",
    "merchant_id",
    "terminal_id",
    "card_fingerprint",
    "amount",
    "currency",
    "first_transaction_id",
    "second_transaction_id",
    "seconds_apart",
]

VIOLATION_COLUMNS = [
    "event_date",
    "merchant_id",
    "transaction_id",
    "violation",
    "charge_entries",
    "entry_id",
]

NETWORK_COLUMNS = [
    "event_date",
    "network",
    "transactions",
    "create_requests",
    "retried_transactions",
    "retry_rate",
    "duplicate_requests",
    "duplicate_rate",
    "in_doubt_transactions",
    "in_doubt_rate",
    "lookup_found_rate",
    "unseen_attempts",
    "link_loss_rate",
]

# Extra output (not in SPEC): link loss per terminal, the report's top-terminals table and
# its by-network chart over the range are sums of these rows. received_attempts: the
# create events (other than key_reused) carrying an ``attempt`` of the terminal's
# transaction keys; network: the key's network, as network_rates attributes it.
LINK_LOSS_COLUMNS = [
    "event_date",
    "merchant_id",
    "terminal_id",
    "network",
    "transactions",
    "received_attempts",
    "unseen_attempts",
    "link_loss_rate",
]

TREND_COLUMNS = [
    "event_date",
    "transactions",
    "create_requests",
    "retry_rate",
    "link_loss_rate",
    "duplicate_rate",
    "in_doubt_rate",
    "lookup_found_rate",
    "acquirer_timeout_rate",
    "suspected_double_charges",
    "exactly_once_violations",
    "create_p95_ms",
]

# Offline selling (issue 16): per event_date × merchant_id × currency (a money column is
# summed within one currency), plus the fleet row ALL per event_date × currency; the day of
# a transaction is its created_at (when the server processed the forwarded advice).
OFFLINE_METRICS = [
    "transactions",
    "offline_transactions",
    "offline_rate",
    "forward_delay_p50_s",
    "forward_delay_p95_s",
    "forward_delay_max_s",
    "offline_declined",
    "offline_decline_rate",
    "offline_amount_at_risk",
    "forwarded_after_day_end",
]
OFFLINE_COLUMNS = ["event_date", "merchant_id", "currency", *OFFLINE_METRICS]
# The same per terminal, terminals with at least one offline transaction.
OFFLINE_TERMINAL_COLUMNS = [
    "event_date",
    "merchant_id",
    "terminal_id",
    "currency",
    *OFFLINE_METRICS,
]

# The duplicate guard (issue 17): per event_date × merchant_id with a block or an override,
# plus the fleet row ALL for every day of the range.
GUARD_COLUMNS = ["event_date", "merchant_id", "duplicates_blocked", "duplicates_overridden"]

# Settlement reconciliation (contract §5): the lake's transactions against the acquirer's
# clearing rows, by rrn, per event_date × merchant_id plus the fleet row ALL for every day
# that has a clearing file. Amounts are signed as they move money (refunds negative).
EXCEPTION_KINDS = ["acquirer_only", "ours_only", "amount_mismatch", "duplicate_rrn"]
RECON_COLUMNS = ["event_date", "merchant_id", "matched", "matched_amount", *EXCEPTION_KINDS]
EXCEPTION_COLUMNS = [
    "event_date",
    "merchant_id",
    "kind",
    "rrn",
    "transaction_id",
    "amount",
    "currency",
    "clearing_amount",
]
