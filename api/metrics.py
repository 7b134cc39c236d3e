"""Prometheus metrics. Labels never carry keys, merchants or card data.

With several uvicorn workers (``idempay serve --workers N``), ``serve`` points
``PROMETHEUS_MULTIPROC_DIR`` at a fresh folder before the workers start, each worker writes
its values there, and ``/metrics`` (whichever worker answers) sums them all
(``exposition``). With one worker, the process's own registry is served."""

from __future__ import annotations

import os
import re
from pathlib import Path

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

REQUESTS = Counter(
    "idempay_requests_total", "Requests by endpoint and outcome.", ["endpoint", "outcome"]
)
LATENCY = Histogram(
    "idempay_request_latency_seconds",
    "Request latency by endpoint.",
    ["endpoint"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
# Every series exists from the start (at 0), so a rate() or an alert never sees "no data"
# before the first request, and the multiprocess exposition lists them too.
OUTCOMES = {
    "create": (
        "created",
        "replayed",
        "in_progress",
        "key_reused",
        "aborted",
        "expired",
        "rejected",
        "error",
    ),
    "lookup": ("found", "processing", "not_found", "fenced"),
    "abort": ("aborted", "already_processed", "in_progress"),
    "reversal": ("reversed", "already_reversed", "rejected"),
}  # fmt: skip  (contract §5's outcome vocabulary)
for _endpoint, _outcomes in OUTCOMES.items():
    LATENCY.labels(_endpoint)
    for _outcome in _outcomes:
        REQUESTS.labels(_endpoint, _outcome)
IN_FLIGHT = Gauge(
    "idempay_in_flight_keys",
    "Keys whose 0200 (or 0220) is out at the acquirer (summed over live workers).",
    multiprocess_mode="livesum",
)
REPLAYS = Counter("idempay_replays_total", "Creates answered with a stored response.")
CONFLICTS = Counter(
    "idempay_conflicts_total", "409 request_in_progress and 422 idempotency_key_reused answers."
)
RECOVERIES = Counter(
    "idempay_recoveries_total", "Keys taken over by the completer, by result.", ["result"]
)
LATE_VOID_FAILURES = Counter(
    "idempay_late_void_failures_total",
    "Voids of a late issuer answer (its key fenced meanwhile) that failed; the fence's own "
    "void and its transaction.aborted outbox event stand.",
)
ACQUIRER_LATE_ANSWERS = Counter(
    "idempay_acquirer_late_answers_total",
    "0210/0410 answers that arrived after their request was settled in doubt (ignored).",
)
ACQUIRER_ADVICE_DEPTH = Gauge(
    "idempay_acquirer_advice_queue_depth",
    "Reversal advices queued and not yet acknowledged by the acquirer.",
    multiprocess_mode="max",
)
ACQUIRER_ADVICE_OLDEST_AGE = Gauge(
    "idempay_acquirer_advice_oldest_age_seconds",
    "Age of the oldest unacknowledged reversal advice (0 when the queue is empty).",
    multiprocess_mode="max",
)
ACQUIRER_ADVICES_SENT = Counter(
    "idempay_acquirer_advices_total", "Reversal advices sent, by result.", ["result"]
)
ACQUIRER_LINK_UP = Gauge(
    "idempay_acquirer_link_up",
    "1 when at least one connection to the acquirer is signed on.",
    multiprocess_mode="max",
)
ACQUIRER_IN_DOUBT = Counter(
    "idempay_acquirer_in_doubt_total",
    "0200s left without an answer (timeout, or connection lost after the write).",
)
EVENTS_DROPPED = Counter("idempay_events_dropped_total", "Request events dropped (queue full).")
CACHE = Counter("idempay_cache_total", "Redis response cache lookups by result.", ["result"])
OUTBOX_PUBLISHED = Counter("idempay_outbox_published_total", "Outbox events published.")
OUTBOX_STREAM_ENTRIES = Gauge(
    "idempay_outbox_stream_entries",
    "Entries in the outbox Redis Stream after the relay's last publish (relay process).",
    multiprocess_mode="max",
)
OUTBOX_STREAM_MAXLEN = Gauge(
    "idempay_outbox_stream_maxlen",
    "The stream's retention bound: XADD trims it to about this many entries (relay process).",
    multiprocess_mode="max",
)
OUTBOX_STREAM_OLDEST_AGE = Gauge(
    "idempay_outbox_stream_oldest_age_seconds",
    "Age of the oldest entry still in the outbox stream: a consumer further behind than this"
    " has lost events from the stream (relay process).",
    multiprocess_mode="max",
)
PURGED = Counter("idempay_purged_total", "Rows purged by retention, by table.", ["table"])
GROUP_COMMIT_TRANSACTIONS = Counter(
    "idempay_group_commit_transactions_total",
    "Transactions the create's group commit began, by kind (claim | finish): with"
    " idempay_group_commit_writes_total, the writes per commit.",
    ["kind"],
)
GROUP_COMMIT_WRITES = Counter(
    "idempay_group_commit_writes_total",
    "Claims or finishes written (committed) by the create's group commit, by kind.",
    ["kind"],
)
GROUP_COMMIT_DELEGATED = Counter(
    "idempay_group_commit_delegated_calls_total",
    "Of those transactions, the ones sent as one delegated call (Citus: the merchant's worker"
    " runs the batch as one function call, api/transactions/delegated.py), by kind.",
    ["kind"],
)
for _kind in ("claim", "finish"):
    GROUP_COMMIT_TRANSACTIONS.labels(_kind)
    GROUP_COMMIT_WRITES.labels(_kind)
    GROUP_COMMIT_DELEGATED.labels(_kind)


_LIVE_GAUGE = re.compile(r"gauge_live\w*_(\d+)\.db")


def _forget_dead_workers(directory: Path) -> None:
    """A SIGKILLed worker never says goodbye: drop its live-gauge files (its counters stay,
    as Prometheus counters must)."""
    for path in directory.glob("gauge_live*.db"):
        match = _LIVE_GAUGE.fullmatch(path.name)
        if match is None:
            continue
        try:
            os.kill(int(match.group(1)), 0)
        except ProcessLookupError:
            multiprocess.mark_process_dead(int(match.group(1)), str(directory))  # type: ignore[no-untyped-call]
        except PermissionError:  # alive, someone else's
            pass


def exposition() -> bytes:
    """The Prometheus text of this process, or of every worker in multiprocess mode."""
    directory = os.environ.get(MULTIPROC_ENV)
    if not directory:
        return generate_latest()
    _forget_dead_workers(Path(directory))
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=directory)  # type: ignore[no-untyped-call]
    return generate_latest(registry)
