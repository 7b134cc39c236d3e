"""Prometheus metrics (per process). Labels never carry keys, merchants or card data."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

REQUESTS = Counter(
    "idempay_requests_total", "Requests by endpoint and outcome.", ["endpoint", "outcome"]
)
LATENCY = Histogram(
    "idempay_request_latency_seconds",
    "Request latency by endpoint.",
    ["endpoint"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
IN_FLIGHT = Gauge("idempay_in_flight_keys", "Keys this process is driving through the issuer.")
REPLAYS = Counter("idempay_replays_total", "Creates answered with a stored response.")
CONFLICTS = Counter(
    "idempay_conflicts_total", "409 request_in_progress and 422 idempotency_key_reused answers."
)
RECOVERIES = Counter(
    "idempay_recoveries_total", "Keys taken over by the completer, by result.", ["result"]
)
EVENTS_DROPPED = Counter("idempay_events_dropped_total", "Request events dropped (queue full).")
CACHE = Counter("idempay_cache_total", "Redis response cache lookups by result.", ["result"])
OUTBOX_PUBLISHED = Counter("idempay_outbox_published_total", "Outbox events published.")
PURGED = Counter("idempay_purged_total", "Rows purged by retention, by table.", ["table"])
