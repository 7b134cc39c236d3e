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
from typing import TypeVar

T = TypeVar("T")

_FIRST_PAUSE = 0.01


def _truthy(value: object) -> bool:
    return bool(value)


def _failure(
    what: str, timeout: float, probes: int, last: object, error: BaseException | None
) -> str:
    seen = f"last error {error!r}" if error is not None else f"last value {last!r}"
    return f"timed out after {timeout:g} s waiting for {what} ({probes} probes; {seen})"


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
    deadline = time.monotonic() + timeout
    pause = min(_FIRST_PAUSE, interval)
    probes = 0
    last: object = None
    error: BaseException | None = None
    while True:
        probes += 1
        try:
            value = probe()
        except ignoring as exc:
            error = exc
        else:
            if until(value):
                return value
            last, error = value, None
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(_failure(what, timeout, probes, last, error))
        time.sleep(min(pause, remaining))
        pause = min(pause * 2, interval)


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
    deadline = time.monotonic() + timeout
    pause = min(_FIRST_PAUSE, interval)
    probes = 0
    last: object = None
    error: BaseException | None = None
    while True:
        probes += 1
        try:
            result = probe()
            value: T = await result if inspect.isawaitable(result) else result
        except ignoring as exc:
            error = exc
        else:
            if until(value):
                return value
            last, error = value, None
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(_failure(what, timeout, probes, last, error))
        await asyncio.sleep(min(pause, remaining))
        pause = min(pause * 2, interval)
