"""Per-API-key (and per-terminal) rate limits with the ``limits`` library: a sliding-window
counter (O(1) per hit) in memory, or in Redis when ``IDEMPAY_REDIS_URL`` is set. A Redis
error lets the request through (the limit is protection, never a correctness mechanism)."""

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


class RateLimiter:
    def __init__(
        self, *, per_key: str, per_terminal: str, redis_url: str | None, prefix: str
    ) -> None:
        storage: Storage
        if redis_url:
            remote = storage_from_string(
                f"async+{redis_url}", implementation="redispy", key_prefix=prefix
            )
            assert isinstance(remote, Storage)
            storage = remote
        else:
            storage = MemoryStorage()
        self._limiter = SlidingWindowCounterRateLimiter(storage)
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
        retry_after = max(1, math.ceil(reset - time.time()))
        raise ApiError(
            429,
            "rate_limited",
            f"Rate limit of {item} exceeded; retry after Retry-After.",
            headers={"Retry-After": str(retry_after)},
        )
