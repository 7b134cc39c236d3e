"""``idempay simulate --outage SECONDS``: the link fully down for part of the fleet (issue 16).

A terminal in the outage cannot reach the server at all for ``SECONDS`` from a second after
the fleet starts: every connection is refused (``httpx.ConnectError`` before anything is
sent). Every terminal of the run sells under ``OUTAGE_POLICY``, so the ones in the outage
accept sales offline (the journal holds them STORED) within its limits and refuse the rest
(``OfflineLimitError``); once the link is back their next sale forwards what they stored,
oldest first, and the end-of-run ``recover()`` forwards whatever is left. The invariants of
contract §8 then hold over the journals: every stored payment forwarded and processed
exactly once (or refused for good and REPORTED), none left STORED.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path

import httpx

from client_sdk import Journal, OfflinePolicy

__all__ = ["OUTAGE_POLICY", "OUTAGE_START_S", "OutageLink", "in_outage", "stored_left"]

OUTAGE_START_S = 0.25
"""The outage starts this long after the fleet does (a quiet machine sold all 80 sales of the
simulate test within the first second: the outage has to begin before that)."""
OUTAGE_POLICY = OfflinePolicy(
    floor_limit=50_000, max_stored_count=40, max_stored_amount=1_000_000, max_age_s=3600.0
)
"""Every simulated sale is at most 500.00 BRL: the count and total are the limits that bite."""


class OutageLink(httpx.BaseTransport):
    """Refuses every connection while the outage lasts (unix times ``start`` to
    ``start + seconds``: the same wall clock in every terminal process)."""

    def __init__(
        self,
        inner: httpx.BaseTransport,
        *,
        start: float,
        seconds: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.inner = inner
        self.start = start
        self.seconds = seconds
        self._clock = clock
        self._lock = threading.Lock()
        self.stats: Counter[str] = Counter()

    def down(self) -> bool:
        return self.start <= self._clock() < self.start + self.seconds

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if self.down():
            with self._lock:
                self.stats["outage_refused"] += 1
            raise httpx.ConnectError("outage: the link is down", request=request)
        return self.inner.handle_request(request)

    def close(self) -> None:
        self.inner.close()


def in_outage(seed: int, index: int, terminals: int, share: float) -> bool:
    """Whether terminal ``index`` loses its link: a seeded ``share`` of the fleet (≥ 1)."""
    count = max(1, round(terminals * share))
    chosen = random.Random(f"{seed}:outage").sample(range(terminals), min(count, terminals))
    return index in chosen


def stored_left(journals: Iterable[Path]) -> int:
    """Payments still STORED (sold offline, never forwarded) in the fleet's journals."""
    left = 0
    for path in journals:
        if path.exists():
            with Journal(path) as journal:
                left += len(journal.stored())
    return left
