"""Rate limits with the ``limits`` library: a sliding-window counter (O(1) per hit) in memory,
or in Redis when ``IDEMPAY_REDIS_URL`` is set. A limit is protection, never a correctness
mechanism: when Redis fails, the limit falls back to this process's memory for a
``CIRCUIT_SECONDS`` circuit (one warning per trip, not one per request, and no Redis timeout
paid by every request while it is out), then Redis is tried again.

- ``RateLimiter``: per API key, and per (API key, terminal) on creates.
- ``AuthFailureLimiter``: failed authentications per client address (API key guessing);
  see ``api/auth.py`` and docs/security.md for who is refused once an address is over it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable

import structlog
from limits import RateLimitItem, parse
from limits.aio.storage import MemoryStorage, Storage
from limits.aio.strategies import SlidingWindowCounterRateLimiter
from limits.storage import storage_from_string

from api.errors import ApiError

log = structlog.get_logger("idempay.ratelimit")


CIRCUIT_SECONDS = 1.0


def _storage(redis_url: str | None, prefix: str) -> Storage:
    if not redis_url:
        return MemoryStorage()
    remote = storage_from_string(f"async+{redis_url}", implementation="redispy", key_prefix=prefix)
    assert isinstance(remote, Storage)
    return remote


class _Window:
    """A sliding-window limiter on Redis with this process's memory as the stand-in while
    Redis is failing (a circuit of ``CIRCUIT_SECONDS``), or on memory alone."""

    def __init__(self, redis_url: str | None, prefix: str, name: str) -> None:
        self._local = SlidingWindowCounterRateLimiter(MemoryStorage())
        self._remote = (
            SlidingWindowCounterRateLimiter(_storage(redis_url, prefix)) if redis_url else None
        )
        self._name = name
        self._open_until = 0.0

    def _pick(self) -> SlidingWindowCounterRateLimiter:
        if self._remote is not None and time.monotonic() >= self._open_until:
            return self._remote
        return self._local

    async def hit(self, item: RateLimitItem, *identifiers: str) -> float | None:
        """Count one hit; the window's reset time (unix s) when over the limit, else None."""
        return await self._ask("hit", item, identifiers)

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
            return await _reset_if_over(self._local, verb, item, identifiers)


async def _reset_if_over(
    limiter: SlidingWindowCounterRateLimiter,
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
    def __init__(
        self, *, per_key: str, per_terminal: str, redis_url: str | None, prefix: str
    ) -> None:
        self._window = _Window(redis_url, prefix, "rate_limit")
        self._per_key: RateLimitItem = parse(per_key)
        self._per_terminal: RateLimitItem = parse(per_terminal)

    async def check(self, key_hash: str, terminal_id: str | None = None) -> None:
        await self._hit(self._per_key, "key", key_hash[:16])
        if terminal_id:
            await self._hit(self._per_terminal, "terminal", key_hash[:16], terminal_id)

    async def _hit(self, item: RateLimitItem, *identifiers: str) -> None:
        reset = await self._window.hit(item, *identifiers)
        if reset is not None:
            raise rate_limited(item, _retry_after(reset))


class AuthFailureLimiter:
    """Failed authentications (401s) per client address, in a sliding window.

    Only failures are counted: a terminal that authenticates never uses up its address's
    budget. ``blocked`` is asked before a key is checked; it answers the Retry-After (s) while
    the address is over the limit, else None. Requests refused while blocked are not counted
    (they never reach a key check), so an address gets about ``limit`` key checks per window
    however hard it hammers, and the block lifts by itself within a window of the last
    counted failure: it never locks an address out for good.
    """

    def __init__(self, *, limit: str, redis_url: str | None, prefix: str) -> None:
        self._window = _Window(redis_url, prefix, "auth_failure_limit")
        self.item: RateLimitItem = parse(limit)

    async def blocked(self, client: str) -> int | None:
        reset = await self._window.test(self.item, "authfail", client)
        return None if reset is None else _retry_after(reset)

    async def failed(self, client: str) -> None:
        await self._window.hit(self.item, "authfail", client)
