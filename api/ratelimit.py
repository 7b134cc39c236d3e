"""Rate limits with the ``limits`` library: a sliding-window counter (O(1) per hit) in memory,
or in Redis when ``IDEMPAY_REDIS_URL`` is set. A limit is protection, never a correctness
mechanism: when Redis fails, the limit falls back to this process's memory for a
``CIRCUIT_SECONDS`` circuit (one warning per trip, not one per request, and no Redis timeout
paid by every request while it is out), then Redis is tried again.

- ``RateLimiter``: per API key (once per request), and per (API key, terminal) on creates.
- ``AuthFailureLimiter``: failed authentications per client address (API key guessing);
  see ``api/auth.py`` and docs/security.md for who is refused once an address is over it.

This process's memory is bounded whatever clients send: ``BoundedWindows`` keeps at most
``capacity`` identities (least recently used forgotten first), so many distinct addresses or
terminal ids cannot grow it; in Redis every window key has the window's TTL.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Protocol

import structlog
from limits import RateLimitItem, parse
from limits.aio.storage import Storage
from limits.aio.strategies import SlidingWindowCounterRateLimiter
from limits.storage import storage_from_string
from limits.util import WindowStats

from api.errors import ApiError

log = structlog.get_logger("idempay.ratelimit")


CIRCUIT_SECONDS = 1.0
MEMORY_CAPACITY = 100_000
"""Identities (addresses, keys, terminals) one in-memory limiter remembers at most."""


class _Limiter(Protocol):
    async def hit(self, item: RateLimitItem, *identifiers: str) -> bool: ...

    async def test(self, item: RateLimitItem, *identifiers: str) -> bool: ...

    async def get_window_stats(self, item: RateLimitItem, *identifiers: str) -> WindowStats: ...


class BoundedWindows:
    """Sliding-window counters (the same weighting as ``limits``' sliding window counter) in
    this process's memory, for at most ``capacity`` identities: the least recently used is
    forgotten first, so a flood of distinct identities costs a bounded amount of memory (and
    an identity that is forgotten starts again from zero, which only ever lets through more,
    never refuses a request that would have passed)."""

    def __init__(self, capacity: int = MEMORY_CAPACITY) -> None:
        self.capacity = capacity
        # identity -> (index of the current window, previous window's count, current count)
        self._windows: OrderedDict[str, tuple[int, int, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._windows)

    def _read(self, item: RateLimitItem, identifiers: tuple[str, ...]) -> tuple[str, int, int, int]:
        """(identity, current window index, previous count, current count) as of now."""
        expiry = item.get_expiry()
        index = int(time.time() // expiry)
        identity = item.key_for(*identifiers)
        start, previous, current = self._windows.get(identity, (index, 0, 0))
        if start == index - 1:
            previous, current = current, 0
        elif start != index:
            previous, current = 0, 0
        return identity, index, previous, current

    @staticmethod
    def _weighted(item: RateLimitItem, previous: int, current: int) -> float:
        expiry = item.get_expiry()
        left_of_previous = expiry - time.time() % expiry
        return previous * left_of_previous / expiry + current

    async def test(self, item: RateLimitItem, *identifiers: str) -> bool:
        _identity, _index, previous, current = self._read(item, identifiers)
        return self._weighted(item, previous, current) + 1 <= item.amount

    async def hit(self, item: RateLimitItem, *identifiers: str) -> bool:
        identity, index, previous, current = self._read(item, identifiers)
        allowed = self._weighted(item, previous, current) + 1 <= item.amount
        self._windows[identity] = (index, previous, current + allowed)
        self._windows.move_to_end(identity)
        while len(self._windows) > self.capacity:
            self._windows.popitem(last=False)
        return allowed

    async def get_window_stats(self, item: RateLimitItem, *identifiers: str) -> WindowStats:
        _identity, index, previous, current = self._read(item, identifiers)
        remaining = max(0, item.amount - math.floor(self._weighted(item, previous, current)))
        return WindowStats((index + 1) * item.get_expiry(), remaining)

    def hit_now(self, identity: str, amount: int, expiry: int) -> float | None:
        """``hit`` for an identity already built (``item.key_for(*identifiers)``), in one call:
        the window's reset time (unix s) when over the limit — what ``get_window_stats``
        answers then — else None. The request path's rate limits (``RateLimiter``)."""
        now = time.time()
        index = int(now // expiry)
        windows = self._windows
        start, previous, current = windows.get(identity, (index, 0, 0))
        if start == index - 1:
            previous, current = current, 0
        elif start != index:
            previous, current = 0, 0
        allowed = previous * (expiry - now % expiry) / expiry + current + 1 <= amount
        windows[identity] = (index, previous, current + allowed)
        windows.move_to_end(identity)
        if len(windows) > self.capacity:
            windows.popitem(last=False)
        return None if allowed else float((index + 1) * expiry)


def _storage(redis_url: str, prefix: str) -> Storage:
    remote = storage_from_string(f"async+{redis_url}", implementation="redispy", key_prefix=prefix)
    assert isinstance(remote, Storage)
    return remote


class _Window:
    """A sliding-window limiter on Redis with this process's memory as the stand-in while
    Redis is failing (a circuit of ``CIRCUIT_SECONDS``), or on memory alone."""

    def __init__(self, redis_url: str | None, prefix: str, name: str) -> None:
        self.local = BoundedWindows()
        self._remote = (
            SlidingWindowCounterRateLimiter(_storage(redis_url, prefix)) if redis_url else None
        )
        self._name = name
        self._open_until = 0.0

    def _pick(self) -> _Limiter:
        if self._remote is not None and time.monotonic() >= self._open_until:
            return self._remote
        return self.local

    async def hit(self, item: RateLimitItem, *identifiers: str) -> float | None:
        """Count one hit; the window's reset time (unix s) when over the limit, else None."""
        return await self._ask("hit", item, identifiers)

    async def hit_key(self, item: RateLimitItem, identity: str, *identifiers: str) -> float | None:
        """``hit`` with the identity (``item.key_for(*identifiers)``) built by the caller:
        on memory one call, no key building; on Redis the library's own path."""
        if self._remote is not None and time.monotonic() >= self._open_until:
            return await self._ask("hit", item, identifiers)
        try:
            return self.local.hit_now(identity, item.amount, item.get_expiry())
        except Exception as exc:  # memory itself failed: let the request through
            log.warning(f"{self._name}_failed", error=type(exc).__name__)
            return None

    async def test(self, item: RateLimitItem, *identifiers: str) -> float | None:
        """Like ``hit`` without counting: the reset time when over the limit, else None."""
        return await self._ask("test", item, identifiers)

    async def _ask(
        self, verb: str, item: RateLimitItem, identifiers: tuple[str, ...]
    ) -> float | None:
        try:
            return await _reset_if_over(self._pick(), verb, item, identifiers)
        except Exception as exc:
            if self._remote is None:  # memory itself failed: let the request through
                log.warning(f"{self._name}_failed", error=type(exc).__name__)
                return None
            self._open_until = time.monotonic() + CIRCUIT_SECONDS
            log.warning(f"{self._name}_degraded", error=type(exc).__name__, fallback="memory")
            return await _reset_if_over(self.local, verb, item, identifiers)


async def _reset_if_over(
    limiter: _Limiter,
    verb: str,
    item: RateLimitItem,
    identifiers: tuple[str, ...],
) -> float | None:
    allowed: Callable[..., Awaitable[bool]] = getattr(limiter, verb)
    if await allowed(item, *identifiers):
        return None
    reset, _remaining = await limiter.get_window_stats(item, *identifiers)
    return reset


def rate_limited(item: RateLimitItem, retry_after: int) -> ApiError:
    return ApiError(
        429,
        "rate_limited",
        f"Rate limit of {item} exceeded; retry after Retry-After.",
        headers={"Retry-After": str(retry_after)},
    )


def _retry_after(reset: float) -> int:
    return max(1, math.ceil(reset - time.time()))


class RateLimiter:
    """Per API key and per (API key, terminal). The limits' keys are built once per API key
    (``_Keys``), not per request: the request path only looks them up."""

    def __init__(
        self, *, per_key: str, per_terminal: str, redis_url: str | None, prefix: str
    ) -> None:
        self._window = _Window(redis_url, prefix, "rate_limit")
        self._per_key: RateLimitItem = parse(per_key)
        self._per_terminal: RateLimitItem = parse(per_terminal)
        self._keys: dict[str, _Keys] = {}

    def _keys_of(self, key_hash: str) -> _Keys:
        keys = self._keys.get(key_hash)
        if keys is None:
            if len(self._keys) >= KEYS_CACHED:
                self._keys.clear()
            keys = self._keys[key_hash] = _Keys(key_hash[:16], self._per_key, self._per_terminal)
        return keys

    async def check(self, key_hash: str, terminal_id: str | None = None) -> None:
        """Count one request against the API key's window; or, given a ``terminal_id`` (the
        create's second call, once its body is read), against that terminal's window only —
        a create is one request of its key, never two."""
        keys = self._keys_of(key_hash)
        if terminal_id is None:
            item = self._per_key
            reset = await self._window.hit_key(item, keys.key, "key", keys.short)
        elif terminal_id:
            item = self._per_terminal
            identity = keys.terminal_head + terminal_id + keys.terminal_tail
            reset = await self._window.hit_key(item, identity, "terminal", keys.short, terminal_id)
        else:
            return
        if reset is not None:
            raise rate_limited(item, _retry_after(reset))


KEYS_CACHED = 10_000  # API keys whose limit keys are kept built (then rebuilt from scratch)


class _Keys:
    """One API key's limit keys, as ``limits`` builds them (``RateLimitItem.key_for``): the
    per-key one whole, the per-terminal one around the terminal id."""

    __slots__ = ("key", "short", "terminal_head", "terminal_tail")

    def __init__(self, short: str, per_key: RateLimitItem, per_terminal: RateLimitItem) -> None:
        self.short = short
        self.key = per_key.key_for("key", short)
        marker = "\x00"
        head, tail = per_terminal.key_for("terminal", short, marker).split(marker)
        self.terminal_head, self.terminal_tail = head, tail


class AuthFailureLimiter:
    """Failed authentications (401s) per client address, in a sliding window.

    Only failures are counted, and only failures are ever refused: a key that authenticates
    never asks this limiter anything, so a terminal with a valid key is never turned away
    because its address (a carrier-grade NAT, a proxy) is over the limit. ``failed`` counts
    one failure and answers the Retry-After (s) once the address is over the limit — that
    failure then answers 429 instead of 401. A failure over the limit is not counted (the
    window is full), so the block lifts by itself within a window of the last counted one.
    """

    def __init__(self, *, limit: str, redis_url: str | None, prefix: str) -> None:
        self._window = _Window(redis_url, prefix, "auth_failure_limit")
        self.item: RateLimitItem = parse(limit)

    @property
    def remembered(self) -> int:
        """Addresses held in this process's memory (bounded by ``MEMORY_CAPACITY``)."""
        return len(self._window.local)

    async def failed(self, client: str) -> int | None:
        reset = await self._window.hit(self.item, "authfail", client)
        return None if reset is None else _retry_after(reset)
