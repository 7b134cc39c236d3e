"""Strict parsers for the text a request carries in its headers and query parameters.

Every numeric header or parameter is read here, and only ASCII digits are a number:
``str.isdigit()`` is also true for "²" (latin-1 0xB2, as a server decodes header bytes),
which ``int()`` refuses, and ``int()`` itself takes " 5", "+5", "1_000" and "١٢". Each
parser returns None for anything else and never raises; the caller decides what None means
(a header ignored, a parameter refused with 422).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone

__all__ = [
    "MAX_DIGITS",
    "parse_capped_seconds",
    "parse_non_negative_int",
    "parse_positive_int",
    "parse_rfc3339",
]

MAX_DIGITS = 18  # below 2**63, and a bound on the work int() does on hostile text
_DIGITS = re.compile(r"[0-9]+")


def _ascii_digits(text: str | bytes | None) -> str | None:
    if text is None:
        return None
    if isinstance(text, bytes):
        text = text.decode("latin-1")
    return text if _DIGITS.fullmatch(text) else None


def parse_non_negative_int(text: str | bytes | None, *, max_digits: int = MAX_DIGITS) -> int | None:
    """``text`` as an integer ≥ 0 when it is 1 to ``max_digits`` ASCII digits, else None."""
    digits = _ascii_digits(text)
    if digits is None or len(digits) > max_digits:
        return None
    return int(digits)


def parse_positive_int(text: str | bytes | None, *, max_digits: int = MAX_DIGITS) -> int | None:
    """``text`` as an integer ≥ 1 when it is 1 to ``max_digits`` ASCII digits, else None."""
    value = parse_non_negative_int(text, max_digits=max_digits)
    return value if value else None


def parse_capped_seconds(text: str | bytes | None, *, cap: int) -> int | None:
    """Whole seconds (ASCII digits, any length) capped at ``cap``; None for anything else.
    A longer run of digits than ``cap`` has is over it: capped without calling ``int()``."""
    digits = _ascii_digits(text)
    if digits is None:
        return None
    if len(digits.lstrip("0")) > len(str(cap)):
        return cap
    return min(int(digits), cap)


# RFC 3339 §5.6 date-time: full-date "T" full-time, time-offset "Z" or ±hh:mm. "T" and "Z"
# may be lower case (§5.6 NOTE). Fractional seconds: at most 6 digits (microseconds) — more
# would be cut silently, so they are refused. A leap second (:60) has no datetime: refused.
_RFC3339 = re.compile(
    r"(?P<year>[0-9]{4})-(?P<month>[0-9]{2})-(?P<day>[0-9]{2})[Tt]"
    r"(?P<hour>[0-9]{2}):(?P<minute>[0-9]{2}):(?P<second>[0-9]{2})"
    r"(?:\.(?P<fraction>[0-9]{1,6}))?"
    r"(?:(?P<utc>[Zz])|(?P<sign>[+-])(?P<off_hour>[0-9]{2}):(?P<off_minute>[0-9]{2}))"
)
_FIELDS = ("year", "month", "day", "hour", "minute", "second")


def parse_rfc3339(text: str) -> datetime | None:
    """An RFC 3339 date-time as an aware datetime in UTC; None for any other text (ISO 8601
    week dates, a missing offset, a space for "T", trailing characters, 7+ fraction digits)
    and for an instant outside years 1–9999 once in UTC."""
    match = _RFC3339.fullmatch(text)
    if match is None or int(match["off_minute"] or 0) > 59:
        return None
    year, month, day, hour, minute, second = (int(match[name]) for name in _FIELDS)
    micro = int((match["fraction"] or "").ljust(6, "0"))
    offset = timedelta(hours=int(match["off_hour"] or 0), minutes=int(match["off_minute"] or 0))
    try:
        zone = timezone(-offset if match["sign"] == "-" else offset)
        moment = datetime(year, month, day, hour, minute, second, micro, tzinfo=zone)
        return moment.astimezone(UTC)
    except (ValueError, OverflowError):  # 02-30, 24:00, offset ≥ 24 h, out of range
        return None
