"""Idempotency keys: UUIDv7 (RFC 9562) minted with the standard library.

48 bits of unix milliseconds, then version 7, 12 random bits, the RFC variant and 62
random bits. Keys always come from ``secrets`` (never from a seeded RNG), so two
terminals seeded alike can never mint the same key.
"""

from __future__ import annotations

import secrets
import time
import uuid

__all__ = ["uuid7"]

_MS_MASK = (1 << 48) - 1


def uuid7(*, unix_ms: int | None = None) -> uuid.UUID:
    """A fresh UUIDv7; ``unix_ms`` overrides the timestamp (tests)."""
    ms = time.time_ns() // 1_000_000 if unix_ms is None else unix_ms
    rand_a = secrets.randbits(12)
    rand_b = secrets.randbits(62)
    value = (ms & _MS_MASK) << 80 | 0x7 << 76 | rand_a << 64 | 0b10 << 62 | rand_b
    return uuid.UUID(int=value)
