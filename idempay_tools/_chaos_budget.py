"""The chaos run's time budget (issue 22): every phase has a deadline derived from the run's
duration, every wait inside it is bounded by that deadline, and a phase that overruns is
named — the run never silently takes longer than its budget.

The phases, in order, and their budgets (``budgets(duration_s)``; D = ``--duration``):

| phase    | what                                                        | budget            |
|----------|-------------------------------------------------------------|-------------------|
| setup    | initdb, PostgreSQL, Redis, migrations, API, sidecars, proxy | 90 s              |
| fleet    | the terminals sell while the faults land (a fault that      | D + max(120, D/2) |
|          | overruns its slot delays the next ones: they run late)      |                   |
| settle   | the terminals stop selling and settle their journals        | 90 s              |
| probe    | every probe key made definitive                             | 45 s              |
| drain    | completer and relay finish every key and event              | 90 s              |
| stop     | API and sidecars stopped (request events flushed)           | 45 s              |
| export   | the final ``idempay export``                                | 90 s              |
| checks   | contract §8, the lake, the offline checks                   | 90 s              |

The whole run is also bounded: ``total_s`` = setup + fleet + 200 s + D/3 (the later phases
share it; 90 s → 530 s, 300 s → 840 s); no phase's deadline is past it. Each wait in the
code ends at its phase's deadline and says what it was waiting for; as a backstop, a phase
still running ``ALARM_GRACE_S`` past its deadline is interrupted (``SIGALRM`` in the main
thread, whatever it is blocked in) with an ``Overrun`` naming it. Cleanup (every process
stopped by PID, the run's folder removed) has ``CLEANUP_S`` more.

``Timeline`` records when each phase started and ended (the report's "Phases" table and
the ``chaos: [+12.3 s] …`` lines on stdout).
"""

from __future__ import annotations

import contextlib
import math
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from idempay_tools.serve_process import say

__all__ = [
    "ALARM_GRACE_S",
    "CLEANUP_S",
    "Interrupted",
    "Overrun",
    "PhaseRecord",
    "Timeline",
    "budgets",
    "install_signal_handlers",
    "total_budget",
]

CLEANUP_S = 60.0
ALARM_GRACE_S = 20.0
PHASES = ("setup", "fleet", "settle", "probe", "drain", "stop", "export", "checks")


def budgets(duration_s: float) -> dict[str, float]:
    """Seconds each phase may take (see the module docstring)."""
    return {
        "setup": 90.0,
        "fleet": duration_s + max(120.0, duration_s / 2),
        "settle": 90.0,
        "probe": 45.0,
        "drain": 90.0,
        "stop": 45.0,
        "export": 90.0,
        "checks": 90.0,
    }


def total_budget(duration_s: float) -> float:
    """The whole run's deadline, cleanup excluded."""
    phases = budgets(duration_s)
    return phases["setup"] + phases["fleet"] + 200.0 + duration_s / 3


class Overrun(Exception):
    """A phase went past its deadline; the message names it."""

    def __init__(self, phase: str, budget_s: float, elapsed_s: float, what: str) -> None:
        self.phase = phase
        super().__init__(
            f"phase '{phase}' overran its {budget_s:.0f} s budget ({elapsed_s:.0f} s in): {what}"
        )


class Interrupted(BaseException):  # noqa: N818 - like KeyboardInterrupt, not caught as Exception
    """The harness got SIGTERM, SIGINT or SIGHUP: stop everything and exit."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"interrupted by {signal.Signals(signum).name}")


@dataclass
class PhaseRecord:
    name: str
    budget_s: float
    started: float  # monotonic
    ended: float | None = None
    overran: str | None = None  # what was still waited for at the deadline

    @property
    def seconds(self) -> float:
        return (self.ended or time.monotonic()) - self.started


class Timeline:
    """The run's phases: their deadlines (each phase's own, and the whole run's) and
    timestamps. ``left()`` is what any wait may still take in the current phase."""

    def __init__(
        self,
        duration_s: float,
        *,
        total_s: float | None = None,
        alarm_grace_s: float = ALARM_GRACE_S,
    ) -> None:
        self.t0 = time.monotonic()
        self.alarm_grace_s = alarm_grace_s
        self.budgets = budgets(duration_s)
        self.total_s = total_s if total_s is not None else total_budget(duration_s)
        self.end = self.t0 + self.total_s
        self.phases: list[PhaseRecord] = []
        self._lock = threading.Lock()

    @property
    def current(self) -> PhaseRecord | None:
        with self._lock:
            return self.phases[-1] if self.phases else None

    def at(self, moment: float | None = None) -> float:
        """Seconds since the harness started."""
        return (time.monotonic() if moment is None else moment) - self.t0

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[PhaseRecord]:
        record = PhaseRecord(name, self.budgets[name], time.monotonic())
        with self._lock:
            self.phases.append(record)
        say(f"chaos: [+{self.at():6.1f} s] {name} (budget {record.budget_s:.0f} s)")
        self._arm(self.deadline(name) + self.alarm_grace_s)
        try:
            yield record
        finally:
            self.disarm()
            record.ended = time.monotonic()
            late = f"; OVERRAN: {record.overran}" if record.overran else ""
            say(f"chaos: [+{self.at():6.1f} s] {name} took {record.seconds:.1f} s{late}")

    def deadline(self, name: str | None = None) -> float:
        """The monotonic deadline of phase ``name`` (default: the current one): its
        budget from its start, and never past the whole run's."""
        record = self._record(name)
        if record is None:
            return self.end
        return min(record.started + record.budget_s, self.end)

    def left(self, cap: float = math.inf, *, phase: str | None = None) -> float:
        """Seconds a wait may still take: at most ``cap``, never past the deadline."""
        return max(0.0, min(cap, self.deadline(phase) - time.monotonic()))

    def expired(self, phase: str | None = None) -> bool:
        return time.monotonic() >= self.deadline(phase)

    def overrun(self, what: str, *, phase: str | None = None) -> Overrun:
        """The error for a wait that reached the deadline of ``phase``; recorded on it."""
        record = self._record(phase)
        if record is None:
            return Overrun("?", self.total_s, self.at(), what)
        record.overran = record.overran or what
        if time.monotonic() >= self.end and record.started + record.budget_s > self.end:
            budget, what = self.total_s, f"the run's deadline passed; {what}"
            return Overrun(record.name, budget, self.at(), what)
        return Overrun(record.name, record.budget_s, time.monotonic() - record.started, what)

    def rows(self) -> list[tuple[str, str, str, str]]:
        """(phase, started at s, took s, budget s) per phase, for the report."""
        return [
            (
                p.name,
                f"{self.at(p.started):.1f}",
                f"{p.seconds:.1f}",
                f"{p.budget_s:.0f}" + (" — OVERRAN" if p.overran else ""),
            )
            for p in self.phases
        ]

    def _record(self, name: str | None) -> PhaseRecord | None:
        with self._lock:
            if name is None:
                return self.phases[-1] if self.phases else None
            return next((p for p in reversed(self.phases) if p.name == name), None)

    # ------------------------------------------------------------------ the watchdog
    def _arm(self, at: float) -> None:
        """SIGALRM at ``at`` (monotonic): the main thread, wherever it is blocked, gets an
        ``Overrun`` naming the phase it is in (main thread only: signals go there)."""
        if threading.current_thread() is not threading.main_thread():
            return
        signal.signal(signal.SIGALRM, self._on_alarm)
        signal.setitimer(signal.ITIMER_REAL, max(0.1, at - time.monotonic()))

    def disarm(self) -> None:
        if threading.current_thread() is threading.main_thread():
            signal.setitimer(signal.ITIMER_REAL, 0.0)

    def _on_alarm(self, signum: int, frame: object) -> None:
        record = self.current
        name = record.name if record else "?"
        raise self.overrun(
            f"still in phase '{name}' {self.alarm_grace_s:g} s past its deadline (interrupted)"
        )


def install_signal_handlers(stopping: Callable[[], bool]) -> None:
    """SIGTERM, SIGINT and SIGHUP raise ``Interrupted`` in the main thread (the ``finally``
    of the run then stops everything it started); once ``stopping()`` is true (cleanup
    has begun) a further signal is only reported, so cleanup is not cut short."""

    def handler(signum: int, frame: object) -> None:
        if stopping():
            say(f"chaos: {signal.Signals(signum).name} during cleanup: still cleaning up")
            return
        raise Interrupted(signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, handler)
