"""Pure retry arithmetic: exponential backoff with full jitter, and Retry-After parsing."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

__all__ = ["RetryPolicy", "backoff", "parse_retry_after"]

_MAX_EXPONENT = 60


def backoff(attempt: int, *, base: float, cap: float, rng: random.Random) -> float:
    """Full-jitter backoff for retry number ``attempt`` (1, 2, ...): uniform in
    ``[0, min(cap, base * 2 ** (attempt - 1))]``."""
    if attempt < 1:
        raise ValueError("attempt starts at 1")
    ceiling = min(cap, base * 2.0 ** min(attempt - 1, _MAX_EXPONENT))
    return rng.uniform(0.0, ceiling)


def parse_retry_after(value: str | None, now: datetime) -> float | None:
    """Seconds to wait from a ``Retry-After`` value (delay-seconds or HTTP-date).

    None when absent or unparseable; an HTTP-date in the past gives 0.
    """
    if value is None:
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        return _seconds_until_date(text, now)
    if not math.isfinite(seconds) or seconds < 0:
        return None
    return seconds


def _seconds_until_date(text: str, now: datetime) -> float | None:
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - now).total_seconds())


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How long to wait between tries: full-jitter backoff, lengthened (never shortened)
    by the server's Retry-After, which is clamped to ``max_retry_after``. A ``Retry-After:
    0`` or a date in the past — from a proxy, or read against a clock that runs ahead —
    can therefore never turn the retries into a storm."""

    base: float = 0.1
    cap: float = 5.0
    max_retry_after: float = 60.0

    def wait(self, attempt: int, retry_after: float | None, rng: random.Random) -> float:
        jittered = backoff(attempt, base=self.base, cap=self.cap, rng=rng)
        if retry_after is None or not math.isfinite(retry_after):
            return jittered
        return max(jittered, min(max(retry_after, 0.0), self.max_retry_after))
