"""Settings, read once from the environment (``IDEMPAY_*``) and passed in.

Nothing here runs at import time: ``Settings()`` is called by ``create_app`` and the CLI.
Every setting is documented in ``docs/configuration.md``.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_SQLITE_DIR = Path("var")
# The embedded SQLite's GIL switch interval (docs/benchmarks.md, "GIL switch interval on
# SQLite": three paired runs against Python's 5 ms, SQLite creates/s x1.26, x1.19, x1.00 at
# ~3 % more CPU).
SQLITE_SWITCH_INTERVAL = 0.0005
_DURATION = re.compile(r"(?P<n>\d+(?:\.\d+)?)(?P<unit>[smhd])?")
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86_400.0}


# uvicorn's ``timeout_graceful_shutdown`` for ``idempay serve`` (seconds). Here, not in
# api/main.py: the serve command must not import the app (and prometheus_client with it)
# before it has prepared the metrics folder of its workers.
GRACEFUL_SHUTDOWN_S = 10


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="IDEMPAY_", extra="ignore")

    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy async URL; unset means embedded SQLite under ./var/.",
    )
    var_dir: Path = Field(default=DEFAULT_SQLITE_DIR, description="Embedded data directory.")
    redis_url: str | None = Field(default=None, description="Optional Redis (advisory only).")
    redis_prefix: str = Field(default="idempay:", description="Prefix of every Redis key.")
    redis_pool_size: int = Field(default=64, ge=1, description="Redis connections per worker.")
    redis_timeout: float = Field(
        default=0.25, gt=0, description="Redis socket and pool-wait timeout (s); then degrade."
    )
    cache_ttl: float = Field(default=86_400.0, gt=0, description="Completed-response cache TTL.")
    lookup_cache_ttl: float = Field(
        default=30.0, gt=0, description="Lookup cache TTL (bounds staleness after a reversal)."
    )
    outbox_stream: str = Field(
        default="", description="Redis Stream of outbox events (default: <prefix>outbox)."
    )
    relay_batch: int = Field(default=500, ge=1, description="Outbox events per relay batch.")
    relay_mark_delay: float = Field(
        default=0.0, ge=0, description="Fault injection for tests: pause between publish and mark."
    )
    relay_lease: float = Field(
        default=30.0,
        gt=0,
        description="Postgres: seconds a stopped leading relay keeps its lock and its"
        " transactions before the database (or the standby relay) ends their sessions"
        " (at least 3 × `--interval`).",
    )
    purge_interval: float = Field(
        default=3600.0, gt=0, description="Seconds between retention purges (in-process)."
    )
    secret_key: str = Field(
        default="idempay-dev-secret-change-me",
        description="Keys the card fingerprint HMAC and the RRN derivation (keep it stable).",
    )
    acquirer_url: str | None = Field(
        default=None,
        description="The acquirer host, iso8583://host:port. Unset: `idempay serve` (and an app"
        " started without it) runs the simulated acquirer host as a child process.",
    )
    acquirer_connections: int = Field(
        default=2, ge=1, le=32, description="Persistent TCP connections to the acquirer."
    )
    answer_within: float = Field(
        default=5.0,
        gt=0,
        description="Seconds a create waits for the acquirer's answer before it answers 202 (the"
        " server finishes the key itself).",
    )
    acquirer_timeout: float = Field(
        default=15.0,
        gt=0,
        description="Seconds after which an unanswered 0200 is in doubt: the key settles declined"
        " / acquirer_timeout and a 0420 reversal advice is queued.",
    )
    acquirer_slow_seconds: float = Field(
        default=2.0, ge=0, description="The child acquirer host's tok_issuer_slow latency."
    )
    advice_interval: float = Field(
        default=0.5, gt=0, description="Seconds between passes of the reversal-advice worker."
    )
    advice_enabled: bool = Field(default=True, description="Run the advice worker in-process.")
    issuer_deadline: float = Field(
        default=60.0, gt=0, description="Seconds after which an unanswered key is voided+aborted."
    )
    lease_seconds: float = Field(
        default=15.0,
        gt=0,
        description="How long a claim owns a key past the acquirer timeout before it can be"
        " taken over (its lease is acquirer_timeout + lease_seconds).",
    )
    completer_interval: float = Field(default=1.0, gt=0, description="Completer poll period (s).")
    completer_enabled: bool = Field(default=True, description="Run the completer in-process.")
    tombstone_retention: float = Field(
        default=35 * 86_400.0,
        gt=0,
        description=(
            "Seconds (or a duration like 35d, 12h, 30m, 45s) tombstones and request events are"
            " kept; also the captured_at age limit."
        ),
    )
    clock_skew_tolerance: float = Field(
        default=300.0,
        ge=0,
        description=(
            "Seconds (or a duration like 5m) a captured_at or UUIDv7 key time may run ahead of"
            " the server's clock; further ahead is 422 clock_skew. Tombstones are kept at least"
            " tombstone_retention + this."
        ),
    )
    rate_limit: str = Field(
        default="600/second", description="Per-API-key limit in `limits` notation, e.g. 100/second."
    )
    rate_limit_terminal: str = Field(
        default="50/second", description="Per-(API key, terminal) limit on creates."
    )
    auth_failure_limit: str = Field(
        default="30/minute",
        description="Failed authentications (401) per client address before that address's"
        " failures answer 429; a valid key always authenticates (docs/security.md).",
    )
    retry_after_seconds: int = Field(default=1, ge=1, description="Retry-After for 409/202/503.")
    prefer_wait_max: float = Field(
        default=20.0,
        ge=0,
        description="Cap on `Prefer: wait=N` (s): how long a create, lookup or abort that finds"
        " its key in flight may be held until it settles (0 turns waiting off).",
    )
    waiters_max: int = Field(
        default=1000,
        ge=0,
        description="Requests one worker holds under `Prefer: wait` at once; beyond it they are"
        " answered at once, as without the preference.",
    )
    event_batch_size: int = Field(default=500, ge=1, description="Request events per flush.")
    event_flush_interval: float = Field(default=0.2, gt=0, description="Event flush period (s).")
    event_queue_max: int = Field(default=100_000, ge=1, description="Bound of the event queue.")
    db_pool_size: int = Field(
        default=30, ge=1, description="Postgres connections per worker process (no overflow)."
    )
    group_commit_lanes: int = Field(
        default=1,
        ge=1,
        description="Batches of claims (and of finishes) written at once per worker on"
        " Postgres. Fewer lanes,"
        " bigger batches and fewer commits; a batch stalled past 0.1 s frees its lane either"
        " way. SQLite always writes one batch at a time.",
    )
    db_timeout: float = Field(default=5.0, gt=0, description="Seconds to wait for a connection.")
    header_timeout: float = Field(
        default=10.0,
        gt=0,
        description="Seconds a client has from connecting (or from a request's first byte) to"
        " the end of its request headers; then 408 (or a silent close if it sent nothing).",
    )
    body_timeout: float = Field(
        default=10.0,
        gt=0,
        description="Seconds a client has from the end of its headers to the end of its request"
        " body; then 408 `request_timeout` and nothing is processed.",
    )
    gc_freeze: bool = Field(
        default=True,
        description="After start-up, collect the young generations and move every object alive"
        " then into Python's permanent generation (gc.freeze): full collections under load"
        " no longer walk the imported modules and the app (their pauses were the server's"
        " longest).",
    )
    gc_threshold: str = Field(
        default="",
        description="gc.set_threshold at start-up, e.g. 700,10,10 (1 to 3 integers >= 0);"
        " empty keeps Python's.",
    )
    switch_interval: float | None = Field(
        default=None,
        ge=0,
        description="sys.setswitchinterval at start-up (s): how long a thread waiting for the"
        " GIL lets the holder run before it asks for it. Unset: 0.0005 on the embedded SQLite"
        " (its writer thread and the event loop hand the GIL to each other at every"
        " statement), Python's own (0.005) on Postgres; 0 keeps Python's.",
    )
    webhook_allow_private: str = Field(
        default="",
        description="Comma-separated CIDRs (e.g. 10.20.0.0/16,127.0.0.1/32) webhooks may be sent"
        " to although they are loopback, link-local, private or otherwise not public; empty:"
        " public addresses only (judged when an endpoint is added and at every attempt).",
    )
    webhook_concurrency: int = Field(
        default=32,
        ge=1,
        description="Webhook attempts the worker makes at once (one at most per endpoint).",
    )
    webhook_lease: float = Field(
        default=30.0,
        gt=0,
        description="Postgres: seconds the leading webhook worker may go without confirming its"
        " lock before the database ends its lock session and a standby leads.",
    )
    log_level: str = Field(default="INFO", description="structlog level.")
    log_json: bool = Field(default=True, description="JSON logs (false: console renderer).")

    @property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite+aiosqlite:///{self.var_dir / 'idempay.db'}"

    @property
    def stream(self) -> str:
        return self.outbox_stream or f"{self.redis_prefix}outbox"

    @property
    def is_sqlite(self) -> bool:
        return self.resolved_database_url.startswith("sqlite")

    @property
    def resolved_switch_interval(self) -> float:
        """The interval to set at start-up; 0: leave Python's."""
        if self.switch_interval is None:
            return SQLITE_SWITCH_INTERVAL if self.is_sqlite else 0.0
        return self.switch_interval

    @property
    def gc_thresholds(self) -> tuple[int, ...]:
        """``gc_threshold`` as ``gc.set_threshold``'s arguments (empty: keep Python's)."""
        return tuple(int(part) for part in self.gc_threshold.split(",") if part.strip())

    @field_validator("gc_threshold")
    @classmethod
    def _check_threshold(cls, value: str) -> str:
        parts = [part.strip() for part in value.split(",") if part.strip()]
        if len(parts) > 3 or not all(part.isdigit() for part in parts):
            raise ValueError("expected up to three integers >= 0, e.g. 700,10,10")
        return ",".join(parts)

    @field_validator("webhook_allow_private")
    @classmethod
    def _check_cidrs(cls, value: str) -> str:
        parts = [part.strip() for part in value.split(",") if part.strip()]
        for part in parts:
            ipaddress.ip_network(part, strict=False)  # ValueError names the bad entry
        return ",".join(parts)

    @field_validator("tombstone_retention", "clock_skew_tolerance", mode="before")
    @classmethod
    def _parse_duration(cls, value: object) -> object:
        if isinstance(value, str):
            match = _DURATION.fullmatch(value.strip())
            if not match:
                raise ValueError("expected seconds or a duration such as 35d, 12h, 30m, 45s")
            return float(match["n"]) * _UNITS[match["unit"] or "s"]
        return value
