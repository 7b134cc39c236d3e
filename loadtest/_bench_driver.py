"""The load generator: a closed loop of ``concurrency`` aiohttp workers, in its own process.

Every worker sends one request, reads the whole response, records its latency and status,
and sends the next, until the round's time is up (requests in flight at the deadline are
finished and counted). ``run_load`` is called in a separate process so the generator's CPU
is its own (reported per round) and it never shares the server's event loop.

Expected answers (anything else is an error): create and bypassed 201; replay 201 with
``Idempotent-Replayed: true``; lookup 200.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import uuid
from array import array
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

import aiohttp

SCENARIOS = ("create", "bypassed", "replay", "lookup")
TERMINALS = 50
_PATHS = {"create": "/v1/transactions", "bypassed": "/_bench/transactions"}


def body_for(index: int) -> bytes:
    """The request body for pool index (or request number) ``index``: 50 terminals."""
    return json.dumps(
        {
            "terminal_id": f"T-{index % TERMINALS + 1:04d}",
            "amount": 1250,
            "currency": "BRL",
            "card": {"token": "tok_visa_4242", "last4": "4242", "brand": "visa"},
        },
        separators=(",", ":"),
    ).encode()


@dataclass(frozen=True, slots=True)
class Load:
    base_url: str
    api_key: str
    scenario: str  # one of SCENARIOS, or "seed" (create every pool key once)
    seconds: float
    concurrency: int
    pool: tuple[str, ...] = ()


@dataclass(slots=True)
class RoundResult:
    scenario: str
    requests: int = 0
    errors: int = 0
    elapsed_s: float = 0.0
    cpu_s: float = 0.0
    statuses: dict[str, int] = field(default_factory=dict)
    latencies_ms: array = field(default_factory=lambda: array("d"))  # type: ignore[type-arg]


Request = tuple[str, str, dict[str, str], bytes | None, bool]


class _Plan:
    """Hands out the next request of a scenario; ``None`` when a seed has sent every key."""

    def __init__(self, load: Load) -> None:
        self.load = load
        self.bodies = [body_for(i) for i in range(TERMINALS)]
        self.counter = itertools.count()
        self.auth = f"Bearer {load.api_key}"

    def _headers(self, key: str) -> dict[str, str]:
        return {
            "Authorization": self.auth,
            "Content-Type": "application/json",
            "Idempotency-Key": key,
        }

    def next(self) -> Request | None:
        n = next(self.counter)
        scenario, base, pool = self.load.scenario, self.load.base_url, self.load.pool
        if scenario in _PATHS:
            key, body = str(uuid.uuid4()), self.bodies[n % TERMINALS]
            return "POST", base + _PATHS[scenario], self._headers(key), body, False
        if scenario == "seed" and n >= len(pool):
            return None
        index = n % len(pool)  # a replay must send the body its key was created with
        key = pool[index]
        if scenario == "lookup":
            return "GET", f"{base}/v1/transactions/{key}", {"Authorization": self.auth}, None, False
        replay = scenario == "replay"
        return (
            "POST",
            base + "/v1/transactions",
            self._headers(key),
            self.bodies[index % TERMINALS],
            replay,
        )


async def _worker(
    session: aiohttp.ClientSession, plan: _Plan, deadline: float, result: RoundResult
) -> None:
    expected = 200 if plan.load.scenario == "lookup" else 201
    statuses: Counter[str] = Counter()
    while time.perf_counter() < deadline and (request := plan.next()) is not None:
        method, url, headers, data, must_replay = request
        started = time.perf_counter()
        try:
            async with session.request(method, url, headers=headers, data=data) as response:
                await response.read()
                label = str(response.status)
                ok = response.status == expected
                if ok and must_replay and response.headers.get("Idempotent-Replayed") != "true":
                    label, ok = f"{label} (not a replay)", False
        except (aiohttp.ClientError, TimeoutError) as exc:
            label, ok = type(exc).__name__, False
        result.latencies_ms.append((time.perf_counter() - started) * 1000.0)
        result.requests += 1
        result.errors += not ok
        statuses[label] += 1
    for label, count in statuses.items():
        result.statuses[label] = result.statuses.get(label, 0) + count


async def _drive(load: Load) -> RoundResult:
    result = RoundResult(load.scenario)
    plan = _Plan(load)
    connector = aiohttp.TCPConnector(limit=load.concurrency, force_close=False)
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        started = time.perf_counter()
        deadline = started + load.seconds
        await asyncio.gather(
            *(_worker(session, plan, deadline, result) for _ in range(load.concurrency))
        )
        result.elapsed_s = time.perf_counter() - started
    return result


def _run(coro: Coroutine[Any, Any, RoundResult]) -> RoundResult:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def run_load(load: Load) -> RoundResult:
    """One round (or the seed) in this process; its CPU time is measured here."""
    cpu = time.process_time()
    result = _run(_drive(load))
    result.cpu_s = time.process_time() - cpu
    return result
