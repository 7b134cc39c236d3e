"""Pure retry arithmetic: exponential backoff with full jitter, Retry-After parsing, and
``RetryPolicy`` — the public knob a client takes as ``retry=``."""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

__all__ = ["RetryPolicy", "backoff", "parse_http_date", "parse_retry_after"]

_MAX_EXPONENT = 60
# delay-seconds (RFC 9110 §10.2.3: 1*DIGIT), with a decimal fraction tolerated; ASCII only —
# float() would also take "١٢", "1e3", "+5" and "1_0".
_DELAY_SECONDS = re.compile(r"[0-9]{1,15}(?:\.[0-9]{1,6})?")
_OWS = " \t"


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
    text = value.strip(_OWS)
    if _DELAY_SECONDS.fullmatch(text):
        return float(text)
    when = parse_http_date(text)
    return None if when is None else max(0.0, (when - now).total_seconds())


def parse_http_date(text: str) -> datetime | None:
    """An HTTP-date (RFC 9110 §5.6.7: IMF-fixdate, or the obsolete RFC 850 and asctime forms
    a recipient must still accept) as an aware datetime; None for anything else, never an
    exception. Printable ASCII only (the e-mail parser's ``int()`` takes "٢٠"). An HTTP-date
    is always UTC: one the parser found no zone in (asctime, ``-0000``) is UTC, never the
    terminal's local time."""
    if not (text.isascii() and text.isprintable()):
        return None
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How a client retries: pass one as ``Client(..., retry=RetryPolicy(...))``.

    Every wait between two tries is full-jitter backoff — uniform in ``[0, min(cap, base *
    2 ** (n - 1))]`` seconds before retry ``n`` — lengthened (never shortened) by the
    server's ``Retry-After``, which is clamped to ``max_retry_after``. A ``Retry-After: 0``
    or a date in the past — from a proxy, or read against a clock that runs ahead — can
    therefore never turn the retries into a storm.

    A payment (``purchase``/``refund``) retries until its ``deadline_s``, not a count;
    ``max_retries`` bounds the retries of a single ``lookup``, ``abort`` or ``reverse``
    called directly (``0``: one try).

    Raises ``ValueError`` for a negative or non-finite ``base``/``cap``/``max_retry_after``
    (or one over 600 s / 3600 s) and a ``max_retries`` that is not an integer ≥ 0.
    """

    base: float = 0.1
    """Ceiling of the first wait, in seconds; it doubles with each retry."""
    cap: float = 5.0
    """The ceiling never grows past this many seconds."""
    max_retry_after: float = 60.0
    """A server's ``Retry-After`` longer than this many seconds is clamped to it."""
    max_retries: int = 2
    """Retries of a single ``lookup``/``abort``/``reverse`` after its first try."""

    def __post_init__(self) -> None:
        _check_seconds("base", self.base, high=600.0)
        _check_seconds("cap", self.cap, high=600.0)
        _check_seconds("max_retry_after", self.max_retry_after, high=3600.0)
        valid = isinstance(self.max_retries, int) and not isinstance(self.max_retries, bool)
        if not valid or self.max_retries < 0:
            raise ValueError(f"max_retries must be an integer ≥ 0: {self.max_retries!r}")

    def wait(self, attempt: int, retry_after: float | None, rng: random.Random) -> float:
        """Seconds to wait before retry number ``attempt`` (1, 2, ...), given the server's
        ``Retry-After`` in seconds (None when it sent none)."""
        jittered = backoff(attempt, base=self.base, cap=self.cap, rng=rng)
        if retry_after is None or not math.isfinite(retry_after):
            return jittered
        return max(jittered, min(max(retry_after, 0.0), self.max_retry_after))


def _check_seconds(name: str, value: float, *, high: float) -> None:
    valid = isinstance(value, int | float) and not isinstance(value, bool)
    if not (valid and math.isfinite(value) and 0.0 <= value <= high):
        raise ValueError(f"{name} must be a finite number ≥ 0 and ≤ {high}: {value!r}")
