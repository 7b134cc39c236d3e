"""Wait for something to become true, instead of sleeping and hoping.

``eventually(probe, what=...)`` calls ``probe`` until its value (or ``until(value)``) is
truthy and returns that value; when ``timeout`` seconds pass first it fails with an
``AssertionError`` that names what was awaited and the last value seen (or the last
exception, for the kinds listed in ``ignoring``). ``eventually_async`` is the same for a
running event loop: its probe may be a coroutine function, and it sleeps without blocking
the loop. The first probe is immediate; later ones back off from 10 ms to ``interval``.

A test that waits for time itself to pass (a TTL, a lease running out) sleeps; a test that
waits for an effect of that time polls for the effect with these.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")

_FIRST_PAUSE = 0.01


def _truthy(value: object) -> bool:
    return bool(value)


class _Wait(Generic[T]):
    """One wait's bookkeeping, shared by both loops: the deadline, the backoff, the probes
    counted, and the last value or error seen (for the failure message)."""

    def __init__(self, what: str, until: Callable[[T], object], timeout: float, interval: float):
        self.what, self.until, self.timeout, self.interval = what, until, timeout, interval
        self.deadline = time.monotonic() + timeout
        self.next_pause = min(_FIRST_PAUSE, interval)
        self.probes = 0
        self.last: object = None
        self.error: BaseException | None = None

    def done(self, value: T) -> bool:
        """Count a probe that answered ``value``; True when it is what was awaited."""
        self.probes += 1
        self.last, self.error = value, None
        return bool(self.until(value))

    def failed(self, error: BaseException) -> None:
        """Count a probe that raised one of the ignored kinds: not yet."""
        self.probes += 1
        self.error = error

    def pause(self) -> float:
        """How long to sleep before the next probe; an ``AssertionError`` when time is up."""
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            error, last = self.error, self.last
            seen = f"last error {error!r}" if error is not None else f"last value {last!r}"
            raise AssertionError(
                f"timed out after {self.timeout:g} s waiting for {self.what} "
                f"({self.probes} probes; {seen})"
            )
        pause = min(self.next_pause, remaining)
        self.next_pause = min(self.next_pause * 2, self.interval)
        return pause


def eventually(
    probe: Callable[[], T],
    *,
    what: str,
    until: Callable[[T], object] = _truthy,
    timeout: float = 10.0,
    interval: float = 0.1,
    ignoring: tuple[type[BaseException], ...] = (),
) -> T:
    """Call ``probe`` until ``until(value)`` is truthy; return that value.

    Exceptions of the ``ignoring`` kinds count as "not yet" (a server still starting);
    any other propagates at once.
    """
    wait = _Wait(what, until, timeout, interval)
    while True:
        try:
            value = probe()
        except ignoring as exc:
            wait.failed(exc)
        else:
            if wait.done(value):
                return value
        time.sleep(wait.pause())


async def eventually_async(
    probe: Callable[[], Awaitable[T]] | Callable[[], T],
    *,
    what: str,
    until: Callable[[T], object] = _truthy,
    timeout: float = 10.0,  # noqa: ASYNC109 (the same signature as eventually)
    interval: float = 0.1,
    ignoring: tuple[type[BaseException], ...] = (),
) -> T:
    """``eventually`` inside an event loop: ``probe`` may return an awaitable (a coroutine
    function, or ``lambda: asyncio.to_thread(blocking, ...)``), which is awaited."""
    wait: _Wait[T] = _Wait(what, until, timeout, interval)
    while True:
        try:
            result = probe()
            value: T = await result if inspect.isawaitable(result) else result
        except ignoring as exc:
            wait.failed(exc)
        else:
            if wait.done(value):
                return value
        await asyncio.sleep(wait.pause())
