"""Redis, strictly advisory (DESIGN.md): it only remembers answers Postgres committed.

- completed responses (``resp:``) with the request fingerprint, for replays;
- the current transaction body (``txn:``), for lookups; dropped around a reversal;
- an in-flight hint (``busy:``) so a concurrent duplicate gets 409 without a database
  round trip while a slow issuer call is in progress.

Postgres decides every claim; nothing here grants ownership. Every key has a TTL. Every
Redis error degrades to "miss" and opens a one-second circuit so a dead Redis costs one
failed call per second, not one per request.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import structlog

from api.metrics import CACHE

log = structlog.get_logger("idempay.cache")
CIRCUIT_SECONDS = 1.0


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

    @property
    def enabled(self) -> bool:
        return self._redis is not None

    def _key(self, kind: str, merchant_id: str, key: str) -> str:
        # {merchant} is a Redis Cluster hash tag: one merchant's keys share a slot.
        return f"{self._prefix}{kind}:{{{merchant_id}}}:{key}"

    def _usable(self) -> bool:
        return self._redis is not None and time.monotonic() >= self._open_until

    def _trip(self, exc: BaseException) -> None:
        self._open_until = time.monotonic() + CIRCUIT_SECONDS
        CACHE.labels("error").inc()
        log.warning("redis_degraded", error=type(exc).__name__)

    async def before_create(
        self, merchant_id: str, key: str
    ) -> tuple[CachedResponse | None, str | None]:
        """(completed response, in-flight fingerprint) in one round trip."""
        if not self._usable():
            return None, None
        try:
            raw, busy = await self._redis.mget(  # type: ignore[union-attr]
                self._key("resp", merchant_id, key), self._key("busy", merchant_id, key)
            )
        except Exception as exc:
            self._trip(exc)
            return None, None
        CACHE.labels("hit" if raw else "miss").inc()
        cached = None
        if raw:
            data = json.loads(raw)
            cached = CachedResponse(data["fp"], data["status"], data["body"].encode(), data["t"])
        return cached, busy.decode() if busy else None

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
        """Remember a committed answer; a fresh creation also primes the lookup cache."""
        if not self._usable():
            return
        value = json.dumps(
            {"fp": fingerprint, "status": status, "body": body.decode(), "t": terminal_id}
        )
        try:
            pipe = self._redis.pipeline(transaction=False)  # type: ignore[union-attr]
            pipe.set(self._key("resp", merchant_id, key), value, ex=self._ttl)
            if created:
                pipe.set(self._key("txn", merchant_id, key), body, ex=self._lookup_ttl)
            await pipe.execute()
        except Exception as exc:
            self._trip(exc)

    async def get_lookup(self, merchant_id: str, key: str) -> bytes | None:
        if not self._usable():
            return None
        try:
            raw = await self._redis.get(self._key("txn", merchant_id, key))  # type: ignore[union-attr]
        except Exception as exc:
            self._trip(exc)
            return None
        CACHE.labels("hit" if raw else "miss").inc()
        return bytes(raw) if raw else None

    async def put_lookup(self, merchant_id: str, key: str, body: bytes) -> None:
        await self._set(self._key("txn", merchant_id, key), body, self._lookup_ttl)

    async def drop_lookup(self, merchant_id: str, key: str) -> None:
        await self._delete(self._key("txn", merchant_id, key))

    async def mark_busy(self, merchant_id: str, key: str, fingerprint: str) -> None:
        await self._set(self._key("busy", merchant_id, key), fingerprint, self._busy_ttl)

    async def clear_busy(self, merchant_id: str, key: str) -> None:
        await self._delete(self._key("busy", merchant_id, key))

    async def _set(self, name: str, value: str | bytes, ttl: int) -> None:
        if not self._usable():
            return
        try:
            await self._redis.set(name, value, ex=ttl)  # type: ignore[union-attr]
        except Exception as exc:
            self._trip(exc)

    async def _delete(self, name: str) -> None:
        if not self._usable():
            return
        try:
            await self._redis.delete(name)  # type: ignore[union-attr]
        except Exception as exc:
            self._trip(exc)
