"""Chaos: the simulated acquirer host as a process of its own for the whole run, and the
acquirer's episodes, laid out in the run's one fault schedule (``chaos.plan``) beside the
server's faults.

``ChaosAcquirer``: ``python -m api.acquirer.host`` (``AcquirerProcess``) with its store and
log under the run's folder, registered by PID with the run's reaper each time it starts;
the API and its sidecars reach it by ``IDEMPAY_ACQUIRER_URL``. Faults are switched through
its control socket (``api/acquirer/host/faults.py``).

The episodes (``acquirer_plan``: one of each kind, order and offsets from the seed; where
they go is below):

=============================  ============================================================
``acquirer_latency``           every answer 1.5 s late plus up to 2.5 s jitter (a spike
                               around the server's answer-within, well under its timeout)
``acquirer_drop_answer``       30 % of the financial messages decided and stored, never
                               answered: their keys go in doubt, their advices reverse them
``acquirer_late_answer``       30 % answered ``LATE_PAST_TIMEOUT_S`` after the link's
                               timeout: in doubt, then a late 0210 that changes nothing
``acquirer_drop_connection``   20 % of the messages close their connection, before or after
                               the decision
``acquirer_kill``              ``kill -9`` of the host, restarted after ``KILL_DOWN_S`` on the
                               same store and port (what it answered was committed first)
``acquirer_outage``            down (listener closed, every connection cut) for
                               ``OUTAGE_S``, then up
=============================  ============================================================

Where they go (``acquirer_plan(duration, seed, quiet)``): only in the run's free time —
from the warm-up to ``END_MARGIN_S`` before the end of ``--duration``, less the ``quiet``
windows that ``chaos.plan`` derives from the server's schedule (the phases whose checks
assume a reachable acquirer: the link outage until its stored payments are forwarded, the
noisy neighbour until its victims are final). Each episode takes its hold plus
``EPISODE_TAIL_S`` (the link answering again after the fault is off) wholly inside one free
interval, one after the other, never two at once; when the holds do not fit (a short run)
they shrink in proportion (``MIN_HOLD_S`` at least; the outage's detail says how long it
was), and an episode that still does not fit goes after the end of the last quiet window,
past ``--duration`` (the fleet runs on until it is done) — never into a quiet window. The
run enforces the same rule as it goes (``chaos.Run._claim``), since a server fault may run
late.

Each episode is healed when its fault is switched off (the host answers a sign-on again
after a kill); it has recovered when a probe create succeeded after that. At the end
``drain_advices`` waits (bounded) for the reversal-advice queue to drain while the API
still runs, and the checks read the host's store (``idempay_tools.invariants``).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from api.acquirer.host.process import AcquirerProcess, sign_on

__all__ = [
    "ACQUIRER_KINDS",
    "ACQUIRER_TIMEOUT_S",
    "EPISODE_TAIL_S",
    "NAMES",
    "RECOVERED_BY",
    "ChaosAcquirer",
    "acquirer_plan",
]

ACQUIRER_TIMEOUT_S = 10.0  # IDEMPAY_ACQUIRER_TIMEOUT of the run
LATE_PAST_TIMEOUT_S = 5.0
KILL_DOWN_S = 2.0
OUTAGE_S = 30.0
EPISODE_TAIL_S = 3.0  # planned after each hold: the link answering again, a probe through
END_MARGIN_S = 5.0  # no episode planned in the last seconds of --duration
MIN_HOLD_S = 1.0
ACQUIRER_KINDS = (
    "acquirer_latency",
    "acquirer_drop_answer",
    "acquirer_late_answer",
    "acquirer_drop_connection",
    "acquirer_kill",
    "acquirer_outage",
)
HOLDS = {
    "acquirer_latency": 12.0,
    "acquirer_drop_answer": 10.0,
    "acquirer_late_answer": 10.0,
    "acquirer_drop_connection": 10.0,
    "acquirer_kill": KILL_DOWN_S,
    "acquirer_outage": OUTAGE_S,
}
FAULTS: dict[str, dict[str, Any]] = {
    "acquirer_latency": {"latency_ms": 1500.0, "jitter_ms": 2500.0},
    "acquirer_drop_answer": {"drop_answer": 0.3},
    "acquirer_late_answer": {
        "late_answer": 0.3,
        "late_seconds": ACQUIRER_TIMEOUT_S + LATE_PAST_TIMEOUT_S,
    },
    "acquirer_drop_connection": {"drop_connection": 0.2, "drop_when": "either"},
}
CLEAR: dict[str, Any] = {
    "latency_ms": 0.0,
    "jitter_ms": 0.0,
    "drop_answer": 0.0,
    "late_answer": 0.0,
    "drop_connection": 0.0,
    "down": False,
}
NAMES = {
    "acquirer_latency": "acquirer latency spike",
    "acquirer_drop_answer": "acquirer drops answers",
    "acquirer_late_answer": "acquirer answers late (past the link's timeout)",
    "acquirer_drop_connection": "acquirer drops connections",
    "acquirer_kill": "acquirer host kill -9, restarted on its store and port",
    "acquirer_outage": "acquirer outage (down, then up)",
}
RECOVERED_BY = {
    kind: (
        "host answering a sign-on again, then a probe create answered"
        if kind == "acquirer_kill"
        else "fault switched off, then a probe create answered"
    )
    for kind in ACQUIRER_KINDS
}


def acquirer_plan(
    duration_s: float, seed: int, quiet: Sequence[tuple[float, float]] = ()
) -> list[tuple[str, float, float]]:
    """(kind, at s from the fleet's start, hold s) for each episode, one after the other in
    the free time of the run: after the warm-up, before ``END_MARGIN_S`` from the end,
    outside every ``quiet`` window (s from the fleet's start), each hold plus
    ``EPISODE_TAIL_S`` inside one free interval (see the module docstring)."""
    rng = random.Random(f"{seed}:acquirer-plan")
    kinds = list(ACQUIRER_KINDS)
    rng.shuffle(kinds)
    warmup = min(15.0, duration_s * 0.1)
    free = _free_intervals(warmup, max(warmup, duration_s - END_MARGIN_S), quiet)
    room = sum(end - start for start, end in free)
    full = sum(HOLDS.values())
    tails = EPISODE_TAIL_S * len(kinds)
    scale = min(1.0, max(0.0, room * 0.9 - tails) / full)
    for attempt in range(30):
        holds = {kind: max(MIN_HOLD_S, HOLDS[kind] * scale) for kind in kinds}
        jitter = random.Random(f"{seed}:acquirer-plan:{attempt}")
        placed = _place(kinds, holds, free, jitter)
        if len(placed) == len(kinds):
            return placed
        scale *= 0.85
    # Not even the shortest holds fit: the rest go after the last quiet window, in turn.
    after = max([duration_s - END_MARGIN_S, *(end for _, end in quiet)])
    for kind in kinds[len(placed) :]:
        placed.append((kind, after, holds[kind]))
        after += holds[kind] + EPISODE_TAIL_S
    return placed


def _free_intervals(
    start: float, end: float, quiet: Sequence[tuple[float, float]]
) -> list[tuple[float, float]]:
    """[start, end] less every quiet window, as sorted disjoint intervals."""
    free = [(start, end)]
    for q_start, q_end in sorted(quiet):
        rest = []
        for a, b in free:
            if q_end <= a or q_start >= b:
                rest.append((a, b))
                continue
            if q_start > a:
                rest.append((a, q_start))
            if q_end < b:
                rest.append((q_end, b))
        free = rest
    return [(a, b) for a, b in free if b - a >= MIN_HOLD_S + EPISODE_TAIL_S]


def _place(
    kinds: list[str],
    holds: dict[str, float],
    free: list[tuple[float, float]],
    jitter: random.Random,
) -> list[tuple[str, float, float]]:
    """Each kind in turn at the first place of ``free`` where its hold and tail fit, with
    the spare time spread between them; as many as fit."""
    need = {kind: holds[kind] + EPISODE_TAIL_S for kind in kinds}
    spare = sum(b - a for a, b in free) - sum(need.values())
    gap = max(0.0, spare) / (len(kinds) + len(free)) / 1.3
    placed: list[tuple[str, float, float]] = []
    index, cursor = 0, free[0][0] if free else 0.0
    for kind in kinds:
        while index < len(free):
            at = max(cursor, free[index][0]) + jitter.uniform(0.0, gap * 0.3)
            if at + need[kind] <= free[index][1]:
                break
            index += 1
        else:
            return placed
        placed.append((kind, at, holds[kind]))
        cursor = at + need[kind] + gap
    return placed


class ChaosAcquirer:
    """The run's acquirer host. ``register(pid, label)`` is told of every process start."""

    def __init__(self, root: Path, seed: int, register: Callable[[int, str], None]) -> None:
        folder = root / "acquirer"
        folder.mkdir(parents=True, exist_ok=True)
        self.host = AcquirerProcess(
            store=folder / "acquirer.sqlite3",
            log_path=root / "logs" / "acquirer.log",
            args=("--seed", str(seed)),
        )
        self._register = register
        self.kills = 0

    @property
    def url(self) -> str:
        return self.host.url

    @property
    def store(self) -> Path:
        return self.host.store

    def start(self, *, timeout: float = 30.0) -> None:
        self.host.launch()
        self._register(self.host.pid, "acquirer")
        self.host.wait_ready(timeout=timeout)

    def alive(self) -> bool:
        return self.host.alive()

    def set(self, **changes: Any) -> None:
        self.host.control(**changes)

    def clear(self) -> None:
        self.host.control(**CLEAR)

    def kill_and_restart(self, *, down_s: float, timeout: float) -> float | None:
        """SIGKILL; ``down_s`` later the host again on the same store, port and control
        port; the monotonic time it answered a sign-on (None: not within ``timeout``)."""
        pid = self.host.pid
        self.host.kill()
        self.kills += 1
        time.sleep(down_s)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:  # the old listener's port may linger a moment
            try:
                self.start(timeout=max(1.0, deadline - time.monotonic()))
            except RuntimeError:
                time.sleep(0.5)
                continue
            if self.host.pid != pid and sign_on(self.host.port):
                return time.monotonic()
        return None

    def stop(self) -> None:
        self.host.stop(timeout=10.0)

    def log_tail(self) -> str:
        return self.host.log_tail()


def episode(
    acquirer: ChaosAcquirer, kind: str, hold_s: float, *, left: Callable[[], float]
) -> tuple[str, float | None]:
    """Run one episode: (what was done, the monotonic time it healed, None when not)."""
    if kind == "acquirer_kill":
        pid = acquirer.host.pid
        up = acquirer.kill_and_restart(down_s=min(hold_s, left()), timeout=min(30.0, left()))
        return f"SIGKILL pid {pid}; restarted after {hold_s:.0f} s on the same store and port", up
    if kind == "acquirer_outage":
        acquirer.set(down=True)
        try:
            time.sleep(min(hold_s, left()))
        finally:
            acquirer.set(down=False)
        return f"down {hold_s:.0f} s (listener closed, connections cut), then up", time.monotonic()
    faults = FAULTS[kind]
    acquirer.set(**faults)
    try:
        time.sleep(min(hold_s, left()))
    finally:
        acquirer.clear()
    said = ", ".join(
        f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in faults.items()
    )
    return f"{said} for {hold_s:.0f} s", time.monotonic()
