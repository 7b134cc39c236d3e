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
epoch is known the cache is off. The epoch can change under a request (the server re-reads
it in the background), so each read takes it once: its keys and the marker check use that one
epoch. An answer read from (or committed to) the database is stored under the epoch known
*before* that database access (``epoch=``): never under an epoch renewed after it.

Postgres decides every claim; nothing here grants ownership. Every key has a TTL. Every
Redis error (``REDIS_ERRORS``, through ``ResponseCache._call``) degrades to "miss" and
opens a one-second circuit so a dead Redis costs one
failed call per second, not one per request.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable
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
MARK_ATTEMPTS = 2  # a reversal's "reversing" mark is tried this often (``mark_reversing``)
# Delete the epoch marker if it announces epoch ARGV[1] (``withdraw_epoch``): one atomic step.
_DELETE_IF_EPOCH = """
local current = redis.call('GET', KEYS[1])
if current and (current == ARGV[1] or string.sub(current, 1, #ARGV[1] + 1) == ARGV[1] .. ':') then
  return redis.call('DEL', KEYS[1])
end
return 0
"""
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
# The same, only while the epoch marker (KEYS[2]) still holds the announcement ARGV[4] seen
# before the answer was read from the database: a flush in between (which took a reversal's
# mark with it) and a new announcement make the write a no-op (``put_lookup``).
_PUT_VERSIONED_IF_ANNOUNCED = (
    "if redis.call('GET', KEYS[2]) ~= ARGV[4] then return 0 end\n" + _PUT_VERSIONED
)


def announcement_of(epoch: str) -> str:
    """A new announcement of ``epoch`` for the epoch marker: the epoch and a nonce of its
    own, so that announcing the same epoch again (after a flush) is told apart."""
    return f"{epoch}:{secrets.token_hex(8)}"


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
        # the epoch marker's value last seen announcing ``_epoch`` (``announcement``)
        self._announcement: str | None = None
        self.epoch_suspect = False  # Redis names a newer epoch: re-read it before serving

    @property
    def enabled(self) -> bool:
        return self._redis is not None

    @property
    def epoch(self) -> str | None:
        return self._epoch

    @property
    def announcement(self) -> str | None:
        """The epoch marker's value last seen announcing this cache's epoch (``epoch:nonce``,
        one nonce per announcement), or None. Taken before a database read whose answer is
        cached as "approved"/"declined" (``put_lookup``, ``put_response``'s priming): that
        write lands only while the marker still holds it — never after a flush (which took a
        reversal's mark with it) and a re-announcement (contract §3.4 with §3.7)."""
        return self._announcement

    def bind_epoch(self, epoch: str | None) -> None:
        """The database's epoch; entries of any other epoch are never read."""
        if epoch != self._epoch:
            self._announcement = None
        self._epoch = epoch
        self.epoch_suspect = False

    async def confirm_epoch(self, epoch: str) -> bool:
        """After reading ``epoch`` from the database: announce it unless an epoch is announced
        already (never over ``idempay admin new-epoch``'s, which a slow re-read may predate).
        True when this call announced it (the marker was missing): the caller must then check
        the database again, since ``epoch`` may have been replaced after it was read and the
        new-epoch's marker lost before this announcement landed (``withdraw_epoch``)."""
        marker, value = self.epoch_marker, announcement_of(epoch)
        done = await self._call(lambda redis: redis.set(marker, value, ex=self._ttl, nx=True), None)
        if done and epoch == self._epoch:
            self._announcement = value
        return bool(done)

    async def withdraw_epoch(self, epoch: str) -> None:
        """Take back an announcement of ``epoch`` the database no longer holds (or could not
        confirm): the marker is deleted only while it still names ``epoch`` — never a later
        announcement. With no marker nothing is served until an epoch is announced again."""
        marker = self.epoch_marker
        await self._call(lambda redis: redis.eval(_DELETE_IF_EPOCH, 1, marker, epoch), None)

    @property
    def epoch_marker(self) -> str:
        """Where ``idempay admin new-epoch`` announces the new epoch to running servers."""
        return f"{self._prefix}epoch"

    def _current(self, marker: bytes | None, epoch: str) -> bool:
        """Whether an answer read under ``epoch`` beside the epoch marker may be served: only
        when the marker names ``epoch``. Not when it names another (a restore was announced
        after this server read ``epoch``), nor when it is missing (expired, or lost with a
        Redis restarted from an older snapshot or failed over to a replica it had not
        reached — the old epoch's entries can come back without it): then nothing is served
        until this server has re-read the database's epoch and re-announced it
        (``confirm_epoch``). Checked against the epoch the keys were built with, never the
        one bound meanwhile: a re-read landing during the round trip must not vouch for the
        old epoch's entries."""
        value = marker.decode() if marker is not None else None
        if value is None or value.partition(":")[0] != epoch:
            self.epoch_suspect = True
            CACHE.labels("stale_epoch").inc()
            return False
        if epoch == self._epoch:  # an older server's bare announcement vouches for no write
            self._announcement = value if ":" in value else None
        return True

    def _key(self, kind: str, merchant_id: str, key: str, epoch: str | None = None) -> str:
        # {merchant} is a Redis Cluster hash tag: one merchant's keys share a slot.
        return f"{self._prefix}{kind}:{epoch or self._epoch}:{{{merchant_id}}}:{key}"

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
        epoch = self._epoch  # one epoch for the keys and the marker check (see _current)
        if epoch is None or not self._usable():  # without Redis: no call, no circuit check
            return None, None
        names = (
            self._key("resp", merchant_id, key, epoch),
            self._key("busy", merchant_id, key, epoch),
            self.epoch_marker,
        )
        found = await self._call(lambda redis: redis.mget(*names), None)
        if found is None:
            return None, None
        raw, busy, marker = found
        if not self._current(marker, epoch):
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
        epoch: str | None,
        created: bool = False,
        announced: str | None = None,
    ) -> None:
        """Remember a committed answer; a fresh creation also primes the lookup cache (as
        version 1: it loses to a reversal that committed in between), while the marker still
        holds ``announced`` (this cache's ``announcement`` before the commit; no priming
        without one). ``epoch``: this cache's ``epoch`` as it was before the answer was read
        or committed; nothing is stored without one."""
        if epoch is None or not self._usable():
            return
        value = json.dumps(
            {"fp": fingerprint, "status": status, "body": body.decode(), "t": terminal_id}
        )

        async def put(redis: Any) -> None:
            pipe = redis.pipeline(transaction=False)
            pipe.set(self._key("resp", merchant_id, key, epoch), value, ex=self._ttl)
            if created and announced is not None:
                txn = self._key("txn", merchant_id, key, epoch)
                pipe.eval(
                    _PUT_VERSIONED_IF_ANNOUNCED,
                    2,
                    txn,
                    self.epoch_marker,
                    APPROVED_OR_DECLINED,
                    body,
                    self._lookup_ttl,
                    announced,
                )
            await pipe.execute()

        await self._call(put, None)

    async def get_lookup(self, merchant_id: str, key: str) -> bytes | None:
        epoch = self._epoch  # one epoch for the key and the marker check (see _current)
        if epoch is None or not self._usable():
            return None
        names = (self._key("txn", merchant_id, key, epoch), self.epoch_marker)
        found = await self._call(lambda redis: redis.mget(*names), None)
        raw, marker = found if found is not None else (None, None)
        if not self._current(marker, epoch):
            return None
        body = bytes(raw).split(b":", 1)[1] if raw else b""
        CACHE.labels("hit" if body else "miss").inc()
        return body or None  # the reversal's bare marker is a miss: ask the database

    async def put_lookup(
        self,
        merchant_id: str,
        key: str,
        body: bytes,
        *,
        epoch: str | None,
        reversed_: bool = False,
        announced: str | None = None,
    ) -> None:
        """Fill the lookup cache from a database read, unless a reversal got there first.
        ``epoch``: this cache's ``epoch`` as it was before that read; nothing is stored
        without one. An "approved"/"declined" answer is stored only while the epoch marker
        still holds ``announced`` (this cache's ``announcement`` before the read): a flush
        since then took any reversal's mark with it. A reversed answer is final: stored
        whatever the marker."""
        if epoch is None:
            return
        if reversed_:
            await self._put_versioned(merchant_id, key, REVERSED, body, epoch)
            return
        if announced is None or not self._usable():
            return
        names = (self._key("txn", merchant_id, key, epoch), self.epoch_marker)
        await self._call(
            lambda redis: redis.eval(
                _PUT_VERSIONED_IF_ANNOUNCED,
                2,
                *names,
                APPROVED_OR_DECLINED,
                body,
                self._lookup_ttl,
                announced,
            ),
            None,
        )

    async def mark_reversing(self, merchant_id: str, key: str, *, epochs: Iterable[str]) -> bool:
        """Before a reversal commits: from now on no "approved" may be cached for the key,
        under any of ``epochs`` (the server's, and the database's read by the reversal: the
        server's may be behind it, and lookups elsewhere are served under the database's).
        True once every mark landed (or there is no cache). The mark is the only thing that
        takes back an "approved" already in Redis, so it is not skipped like a cache write:
        it goes to Redis even while the circuit is open, twice if need be; False → the
        reversal must not commit (contract §3.7)."""
        if self._redis is None:
            return True
        for epoch in dict.fromkeys(epochs):
            name = self._key("txn", merchant_id, key, epoch)
            for _attempt in range(MARK_ATTEMPTS):
                try:
                    await self._redis.eval(_PUT_VERSIONED, 1, name, REVERSED, b"", self._ttl)
                    break
                except REDIS_ERRORS as exc:
                    self._trip(exc)
            else:
                return False
        return True

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

    async def _put_versioned(
        self, merchant_id: str, key: str, version: int, body: bytes, epoch: str
    ) -> None:
        # A reversed entry is final: it outlives any writer that could still hold an older read.
        ttl = self._ttl if version == REVERSED else self._lookup_ttl
        name = self._key("txn", merchant_id, key, epoch)
        await self._call(
            lambda redis: redis.eval(_PUT_VERSIONED, 1, name, version, body, ttl), None
        )

    async def _set(self, name: str, value: str | bytes, ttl: int) -> None:
        await self._call(lambda redis: redis.set(name, value, ex=ttl), None)

    async def _delete(self, name: str) -> None:
        await self._call(lambda redis: redis.delete(name), None)
