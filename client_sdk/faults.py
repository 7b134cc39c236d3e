"""Fault injection for tests and simulation: httpx transports that wrap a real one.

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
import random
import threading
import time
from collections.abc import Awaitable, Callable

import httpx

__all__ = ["AsyncFaultyTransport", "FaultyTransport"]

_MODES = ("drop_request", "drop_response", "delay", "reset")


class _FaultPlan:
    """The seeded draw shared by the sync and async transports."""

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


class FaultyTransport(httpx.BaseTransport):
    """Wraps a sync transport (e.g. ``httpx.HTTPTransport`` or ``httpx.MockTransport``)."""

    def __init__(
        self,
        inner: httpx.BaseTransport,
        *,
        seed: int | None = None,
        drop_request: float = 0.0,
        drop_response: float = 0.0,
        delay: float = 0.0,
        delay_s: float = 0.5,
        reset: float = 0.0,
        sleep: Callable[[float], None] = time.sleep,
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
        return self._plan.stats()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        fault = self._plan.draw()
        _before(fault, request)
        if fault == "delay":
            self._sleep(self._delay_s)
        response = self._inner.handle_request(request)
        if fault in ("drop_response", "reset_after"):
            response.read()
            response.close()
            raise self._plan.lost_response(fault, request)
        return response

    def close(self) -> None:
        self._inner.close()


class AsyncFaultyTransport(httpx.AsyncBaseTransport):
    """Wraps an async transport, same faults as ``FaultyTransport``."""

    def __init__(
        self,
        inner: httpx.AsyncBaseTransport,
        *,
        seed: int | None = None,
        drop_request: float = 0.0,
        drop_response: float = 0.0,
        delay: float = 0.0,
        delay_s: float = 0.5,
        reset: float = 0.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
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
        return self._plan.stats()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        fault = self._plan.draw()
        _before(fault, request)
        if fault == "delay":
            await self._sleep(self._delay_s)
        response = await self._inner.handle_async_request(request)
        if fault in ("drop_response", "reset_after"):
            await response.aread()
            await response.aclose()
            raise self._plan.lost_response(fault, request)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()
