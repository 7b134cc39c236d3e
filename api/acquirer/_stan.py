"""STANs (field 11) and reconnect delays: two small pure pieces of the link."""

from __future__ import annotations

import random
from collections.abc import Callable, Container

__all__ = ["StanAllocator", "backoff_delay"]

STAN_MAX = 999_999


class StanAllocator:
    """``000001`` … ``999999``, then ``000001`` again, skipping any STAN still in flight."""

    def __init__(self, start: int = 1) -> None:
        if not 1 <= start <= STAN_MAX:
            raise ValueError(f"a STAN is 1..{STAN_MAX}, not {start}")
        self._next = start

    def allocate(self, in_flight: Container[str]) -> str:
        for _ in range(STAN_MAX):
            stan = f"{self._next:06d}"
            self._next = self._next % STAN_MAX + 1
            if stan not in in_flight:
                return stan
        raise RuntimeError("every STAN is in flight")


def backoff_delay(
    failures: int,
    *,
    base_s: float = 0.1,
    cap_s: float = 10.0,
    rand: Callable[[], float] = random.random,
) -> float:
    """Seconds to wait after ``failures`` failed attempts in a row: "full jitter" — uniform
    in [0, min(cap, base·2^failures)), so many links reconnecting at once spread out."""
    return rand() * min(cap_s, base_s * 2.0 ** min(failures, 32))
