"""Fault injection for tests and simulation: ``FaultTransport``, an httpx transport that
wraps a real one, for sync and async clients alike (``FaultyTransport`` and
``AsyncFaultyTransport`` are deprecated aliases of it, kept for one release).

Each request draws one fault from a seeded ``random.Random`` (so a seed replays the same
sequence of faults for the same sequence of requests):

- ``drop_request``: raise ``httpx.ConnectError`` without forwarding (certainly not sent);
- ``drop_response``: forward (the server processes it), then raise ``httpx.ReadTimeout``
  or ``httpx.RemoteProtocolError`` instead of returning the answer (the in-doubt case);
- ``delay``: sleep ``delay_s``, then forward normally;
- ``reset``: raise ``httpx.ReadError``, at random before or after forwarding.

``stats`` counts requests and what was injected.
"""

from __future__ import annotations

import asyncio
import inspect
import random
import threading
import time
from collections.abc import Callable

import httpx

__all__ = ["AsyncFaultyTransport", "FaultTransport", "FaultyTransport"]

_MODES = ("drop_request", "drop_response", "delay", "reset")


class _FaultPlan:
    """The seeded draw: which fault, if any, each request gets (thread-safe)."""

    def __init__(self, seed: int | None, probabilities: dict[str, float]) -> None:
        for mode, p in probabilities.items():
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"{mode} must be a probability in [0, 1]")
        if sum(probabilities.values()) > 1.0 + 1e-9:
            raise ValueError("fault probabilities must add up to at most 1")
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._probabilities = probabilities
        self._stats = dict.fromkeys(
            (
                "requests",
                "passed",
                "drop_request",
                "drop_response",
                "delay",
                "reset_before",
                "reset_after",
            ),
            0,
        )

    def draw(self) -> str:
        """One of: passed, drop_request, drop_response, delay, reset_before, reset_after."""
        with self._lock:
            roll, fault = self._rng.random(), "passed"
            for mode in _MODES:
                roll -= self._probabilities[mode]
                if roll < 0:
                    fault = mode
                    break
            if fault == "reset":
                fault = "reset_before" if self._rng.random() < 0.5 else "reset_after"
            self._stats["requests"] += 1
            self._stats[fault] += 1
            return fault

    def lost_response(self, fault: str, request: httpx.Request) -> httpx.TransportError:
        if fault == "reset_after":
            return httpx.ReadError("injected fault: connection reset", request=request)
        with self._lock:
            timeout = self._rng.random() < 0.5
        if timeout:
            return httpx.ReadTimeout("injected fault: response lost", request=request)
        return httpx.RemoteProtocolError("injected fault: response lost", request=request)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return dict(self._stats)


def _before(fault: str, request: httpx.Request) -> None:
    if fault == "drop_request":
        raise httpx.ConnectError("injected fault: request dropped", request=request)
    if fault == "reset_before":
        raise httpx.ReadError("injected fault: connection reset", request=request)


class FaultTransport(httpx.BaseTransport, httpx.AsyncBaseTransport):
    """Wraps a real transport and injects seeded faults; one class for both modes, like
    ``httpx.MockTransport``: give it to ``httpx.Client`` / ``Client`` to wrap a sync
    transport (``httpx.HTTPTransport``), or to ``httpx.AsyncClient`` / ``AsyncClient`` to
    wrap an async one (``httpx.AsyncHTTPTransport``); ``httpx.MockTransport`` serves both.

    ``drop_request``, ``drop_response``, ``delay`` and ``reset`` are the probabilities of
    each fault per request (each in [0, 1], together at most 1, else ``ValueError``);
    ``delay_s`` is how long a delayed request waits. ``sleep`` replaces the wait (tests): a
    plain function, or in async mode one returning an awaitable; by default
    ``time.sleep`` (sync) or ``asyncio.sleep`` (async).
    """

    def __init__(
        self,
        inner: httpx.BaseTransport | httpx.AsyncBaseTransport,
        *,
        seed: int | None = None,
        drop_request: float = 0.0,
        drop_response: float = 0.0,
        delay: float = 0.0,
        delay_s: float = 0.5,
        reset: float = 0.0,
        sleep: Callable[[float], object] | None = None,
    ) -> None:
        self._inner = inner
        self._plan = _FaultPlan(
            seed,
            {
                "drop_request": drop_request,
                "drop_response": drop_response,
                "delay": delay,
                "reset": reset,
            },
        )
        self._delay_s = delay_s
        self._sleep = sleep

    @property
    def stats(self) -> dict[str, int]:
        """Counts so far: ``requests``, ``passed``, and one per injected fault
        (``drop_request``, ``drop_response``, ``delay``, ``reset_before``, ``reset_after``)."""
        return self._plan.stats()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        """Forward ``request`` to the sync inner transport, or fail it as drawn."""
        inner = self._inner
        if not isinstance(inner, httpx.BaseTransport):
            raise TypeError("FaultTransport wraps an async transport: use it with an async client")
        fault = self._plan.draw()
        _before(fault, request)
        if fault == "delay":
            waited = (self._sleep or time.sleep)(self._delay_s)
            if inspect.isawaitable(waited):
                _discard(waited)
                raise TypeError("FaultTransport in sync mode needs a sleep that blocks")
        response = inner.handle_request(request)
        if fault in ("drop_response", "reset_after"):
            response.read()
            response.close()
            raise self._plan.lost_response(fault, request)
        return response

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Forward ``request`` to the async inner transport, or fail it as drawn."""
        inner = self._inner
        if not isinstance(inner, httpx.AsyncBaseTransport):
            raise TypeError("FaultTransport wraps a sync transport: use it with a sync client")
        fault = self._plan.draw()
        _before(fault, request)
        if fault == "delay":
            waited = (self._sleep or asyncio.sleep)(self._delay_s)
            if inspect.isawaitable(waited):
                await waited
        response = await inner.handle_async_request(request)
        if fault in ("drop_response", "reset_after"):
            await response.aread()
            await response.aclose()
            raise self._plan.lost_response(fault, request)
        return response

    def close(self) -> None:
        """Close the inner transport (sync mode)."""
        if isinstance(self._inner, httpx.BaseTransport):
            self._inner.close()

    async def aclose(self) -> None:
        """Close the inner transport (async mode)."""
        if isinstance(self._inner, httpx.AsyncBaseTransport):
            await self._inner.aclose()


def _discard(awaitable: object) -> None:
    close = getattr(awaitable, "close", None)  # a coroutine never awaited: no warning
    if callable(close):
        close()


FaultyTransport = FaultTransport
"""Deprecated alias (one release): ``FaultTransport`` serves both modes."""
AsyncFaultyTransport = FaultTransport
"""Deprecated alias (one release): ``FaultTransport`` serves both modes."""
