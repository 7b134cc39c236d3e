"""Redis, strictly advisory (DESIGN.md): it only remembers answers Postgres committed.

- completed responses (``resp:``) with the request fingerprint, for replays;
- the current transaction body (``txn:``), for lookups, stored as ``<version>:<body>``
  (version 1: approved or declined, 2: reversed; ``2:`` alone is the reversal's marker,
  "ask the database"). Every write is a compare-and-set on the version (a Lua script), so a
  writer that read "approved" before a reversal committed can never overwrite what the
  reversal wrote (contract §3.7);
- an in-flight hint (``busy:``) so a concurrent duplicate gets 409 without a database
  round trip while a slow issuer call is in progress; a fence overwrites it with
  ``fenced`` and a claim only sets it if absent, so it never hides a fence.

Every key carries the database's epoch (``api/idempotency/epoch.py``, contract §3.6): after a
restore and ``idempay admin new-epoch`` no entry from before is read again. Until the
epoch is known the cache is off.

Postgres decides every claim; nothing here grants ownership. Every key has a TTL. Every
Redis error (``REDIS_ERRORS``, through ``ResponseCache._call``) degrades to "miss" and
opens a one-second circuit so a dead Redis costs one
failed call per second, not one per request.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog
from redis.exceptions import RedisError

from api.metrics import CACHE

log = structlog.get_logger("idempay.cache")
T = TypeVar("T")
# What a sick Redis raises (redis-py wraps most socket errors in RedisError): these degrade;
# anything else is a bug and propagates.
REDIS_ERRORS: tuple[type[BaseException], ...] = (RedisError, ConnectionError, TimeoutError, OSError)
CIRCUIT_SECONDS = 1.0
APPROVED_OR_DECLINED, REVERSED = 1, 2  # a transaction's states, in the only order they go
FENCED = "fenced"
# SET the lookup entry unless the one there has a higher version (a reversal's).
_PUT_VERSIONED = """
local current = redis.call('GET', KEYS[1])
if current then
  local version = tonumber(string.match(current, '^(%d+):'))
  if version and version > tonumber(ARGV[1]) then return 0 end
end
redis.call('SET', KEYS[1], ARGV[1] .. ':' .. ARGV[2], 'EX', ARGV[3])
return 1
"""


@dataclass(frozen=True, slots=True)
class CachedResponse:
    fingerprint: str
    status: int
    body: bytes
    terminal_id: str | None


class ResponseCache:
    def __init__(
        self, redis: Any | None, *, prefix: str, ttl: float, lookup_ttl: float, busy_ttl: float
    ) -> None:
        self._redis = redis
        self._prefix = prefix
        self._ttl = max(1, int(ttl))
        self._lookup_ttl = max(1, int(lookup_ttl))
        self._busy_ttl = max(1, int(busy_ttl))
        self._open_until = 0.0
        self._epoch: str | None = None
        self.epoch_suspect = False  # Redis names a newer epoch: re-read it before serving

    @property
    def enabled(self) -> bool:
        return self._redis is not None

    @property
    def epoch(self) -> str | None:
        return self._epoch

    def bind_epoch(self, epoch: str | None) -> None:
        """The database's epoch; entries of any other epoch are never read."""
        self._epoch = epoch
        self.epoch_suspect = False

    @property
    def epoch_marker(self) -> str:
        """Where ``idempay admin new-epoch`` announces the new epoch to running servers."""
        return f"{self._prefix}epoch"

    def _current(self, marker: bytes | None) -> bool:
        """Whether an answer read beside the epoch marker may be served: not when the
        marker names another epoch (a restore was announced and this server has not
        re-read the database's epoch yet) — then nothing is served until it has."""
        if marker is not None and marker.decode() != self._epoch:
            self.epoch_suspect = True
            CACHE.labels("stale_epoch").inc()
            return False
        return True

    def _key(self, kind: str, merchant_id: str, key: str) -> str:
        # {merchant} is a Redis Cluster hash tag: one merchant's keys share a slot.
        return f"{self._prefix}{kind}:{self._epoch}:{{{merchant_id}}}:{key}"

    def _usable(self) -> bool:
        return (
            self._redis is not None
            and self._epoch is not None
            and time.monotonic() >= self._open_until
        )

    def _trip(self, exc: BaseException) -> None:
        self._open_until = time.monotonic() + CIRCUIT_SECONDS
        CACHE.labels("error").inc()
        log.warning("redis_degraded", error=type(exc).__name__)

    async def _call(self, op: Callable[[Any], Awaitable[T]], default: T) -> T:
        """``op(redis)`` when the cache is usable; on a Redis error, log, count, open the
        circuit and degrade to ``default`` (a miss, or nothing written)."""
        if not self._usable():
            return default
        try:
            return await op(self._redis)
        except REDIS_ERRORS as exc:
            self._trip(exc)
            return default

    async def before_create(
        self, merchant_id: str, key: str
    ) -> tuple[CachedResponse | None, str | None]:
        """(completed response, in-flight fingerprint) in one round trip."""
        if not self._usable():  # the common case without Redis: no call, no circuit check
            return None, None
        names = (
            self._key("resp", merchant_id, key),
            self._key("busy", merchant_id, key),
            self.epoch_marker,
        )
        found = await self._call(lambda redis: redis.mget(*names), None)
        if found is None:
            return None, None
        raw, busy, marker = found
        if not self._current(marker):
            return None, None
        CACHE.labels("hit" if raw else "miss").inc()
        cached = None
        if raw:
            data = json.loads(raw)
            cached = CachedResponse(data["fp"], data["status"], data["body"].encode(), data["t"])
        in_flight = busy.decode() if busy else None
        return cached, None if in_flight == FENCED else in_flight

    async def put_response(
        self,
        merchant_id: str,
        key: str,
        *,
        fingerprint: str,
        status: int,
        body: bytes,
        terminal_id: str | None,
        created: bool = False,
    ) -> None:
        """Remember a committed answer; a fresh creation also primes the lookup cache (as
        version 1: it loses to a reversal that committed in between)."""
        if not self._usable():
            return
        value = json.dumps(
            {"fp": fingerprint, "status": status, "body": body.decode(), "t": terminal_id}
        )

        async def put(redis: Any) -> None:
            pipe = redis.pipeline(transaction=False)
            pipe.set(self._key("resp", merchant_id, key), value, ex=self._ttl)
            if created:
                txn = self._key("txn", merchant_id, key)
                pipe.eval(_PUT_VERSIONED, 1, txn, APPROVED_OR_DECLINED, body, self._lookup_ttl)
            await pipe.execute()

        await self._call(put, None)

    async def get_lookup(self, merchant_id: str, key: str) -> bytes | None:
        if not self._usable():
            return None
        names = (self._key("txn", merchant_id, key), self.epoch_marker)
        found = await self._call(lambda redis: redis.mget(*names), None)
        raw, marker = found if found is not None else (None, None)
        if not self._current(marker):
            return None
        body = bytes(raw).split(b":", 1)[1] if raw else b""
        CACHE.labels("hit" if body else "miss").inc()
        return body or None  # the reversal's bare marker is a miss: ask the database

    async def put_lookup(
        self, merchant_id: str, key: str, body: bytes, *, reversed_: bool = False
    ) -> None:
        """Fill the lookup cache from a database read, unless a reversal got there first."""
        version = REVERSED if reversed_ else APPROVED_OR_DECLINED
        await self._put_versioned(merchant_id, key, version, body)

    async def mark_reversing(self, merchant_id: str, key: str) -> None:
        """Before a reversal commits: from now on no "approved" may be cached for the key."""
        await self._put_versioned(merchant_id, key, REVERSED, b"")

    async def drop_lookup(self, merchant_id: str, key: str) -> None:
        await self._delete(self._key("txn", merchant_id, key))

    async def mark_busy(self, merchant_id: str, key: str, fingerprint: str) -> None:
        name = self._key("busy", merchant_id, key)  # nx: never over a fence's marker
        await self._call(
            lambda redis: redis.set(name, fingerprint, ex=self._busy_ttl, nx=True), None
        )

    async def clear_busy(self, merchant_id: str, key: str) -> None:
        await self._delete(self._key("busy", merchant_id, key))

    async def mark_fenced(self, merchant_id: str, key: str) -> None:
        """After a fence commits: a busy hint left by a dead or late claimer must not answer
        409 for a key whose answer is now 410."""
        await self._set(self._key("busy", merchant_id, key), FENCED, self._busy_ttl)

    async def _put_versioned(self, merchant_id: str, key: str, version: int, body: bytes) -> None:
        # A reversed entry is final: it outlives any writer that could still hold an older read.
        ttl = self._ttl if version == REVERSED else self._lookup_ttl
        name = self._key("txn", merchant_id, key)
        await self._call(
            lambda redis: redis.eval(_PUT_VERSIONED, 1, name, version, body, ttl), None
        )

    async def _set(self, name: str, value: str | bytes, ttl: int) -> None:
        await self._call(lambda redis: redis.set(name, value, ex=ttl), None)

    async def _delete(self, name: str) -> None:
        await self._call(lambda redis: redis.delete(name), None)
