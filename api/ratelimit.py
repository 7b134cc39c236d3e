"""Rate limits with the ``limits`` library: a sliding-window counter (O(1) per hit) in memory,
or in Redis when ``IDEMPAY_REDIS_URL`` is set. A Redis error lets the request through (a limit
is protection, never a correctness mechanism).

- ``RateLimiter``: per API key, and per (API key, terminal) on creates.
- ``AuthFailureLimiter``: failed authentications per client address (API key guessing);
  see ``api/auth.py`` and docs/security.md for who is refused once an address is over it.
"""

from __future__ import annotations

import math
import time

import structlog
from limits import RateLimitItem, parse
from limits.aio.storage import MemoryStorage, Storage
from limits.aio.strategies import SlidingWindowCounterRateLimiter
from limits.storage import storage_from_string

from api.errors import ApiError

log = structlog.get_logger("idempay.ratelimit")


def _storage(redis_url: str | None, prefix: str) -> Storage:
    if not redis_url:
        return MemoryStorage()
    remote = storage_from_string(f"async+{redis_url}", implementation="redispy", key_prefix=prefix)
    assert isinstance(remote, Storage)
    return remote


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
        self._limiter = SlidingWindowCounterRateLimiter(_storage(redis_url, prefix))
        self._per_key: RateLimitItem = parse(per_key)
        self._per_terminal: RateLimitItem = parse(per_terminal)

    async def check(self, key_hash: str, terminal_id: str | None = None) -> None:
        await self._hit(self._per_key, "key", key_hash[:16])
        if terminal_id:
            await self._hit(self._per_terminal, "terminal", key_hash[:16], terminal_id)

    async def _hit(self, item: RateLimitItem, *identifiers: str) -> None:
        try:
            allowed = await self._limiter.hit(item, *identifiers)
            if allowed:
                return
            reset, _remaining = await self._limiter.get_window_stats(item, *identifiers)
        except Exception as exc:  # Redis down: degrade, never fail the payment
            log.warning("rate_limit_degraded", error=type(exc).__name__)
            return
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
        self._limiter = SlidingWindowCounterRateLimiter(_storage(redis_url, prefix))
        self.item: RateLimitItem = parse(limit)

    async def blocked(self, client: str) -> int | None:
        try:
            if await self._limiter.test(self.item, "authfail", client):
                return None
            reset, _remaining = await self._limiter.get_window_stats(self.item, "authfail", client)
        except Exception as exc:  # Redis down: degrade to "not blocked"
            log.warning("auth_failure_limit_degraded", error=type(exc).__name__)
            return None
        return _retry_after(reset)

    async def failed(self, client: str) -> None:
        try:
            await self._limiter.hit(self.item, "authfail", client)
        except Exception as exc:
            log.warning("auth_failure_limit_degraded", error=type(exc).__name__)
