"""``make chaos``: a terminal fleet through the chaos proxy while faults land on a seeded
schedule; then contract §8's invariants and the ledger balance per merchant.

    python -m idempay_tools.chaos [--duration 300] [--seed 7] [--terminals 12]
                             [--report docs/reliability.md] [--keep] [--deadline S]

What runs (all private to the run, on loopback): a PostgreSQL cluster and a Redis of the
harness's own (``idempay_tools._chaos_services``), ``idempay serve --workers 2`` on them,
``idempay completer`` and ``idempay relay`` as their own processes, the chaos proxy in
front of the API (3.5 % of requests hit a network fault), the terminals (one process
each, SDK + journal, spread over three merchants; clocks of terminals 0, 1 and 2 run
120 s behind, 120 s ahead (within the server's 5-minute tolerance) and 15 min ahead
(beyond it)), a probe that sends a create straight to the API four times a second, and
``idempay export`` of the run's days in a loop (``idempay_tools._chaos_phases``).

The faults (``plan``): an API worker SIGKILLed; a terminal SIGKILLed and rebooted on its
journal (it ``recover()``s first); PostgreSQL crashed (``pg_ctl -m immediate``) and
restarted; Redis SIGKILLed and restarted empty; a 30 % loss burst on the link; a
terminal's journal disk full (RLIMIT_FSIZE on its process, flapping on and off, so some
writes fail with a payment in flight); a database restore with Redis kept (``pg_dump``,
selling on, API stopped, ``pg_restore``, ``idempay admin new-epoch``, API started, then a
lookup of every payment the restore took back); a rolling restart (each API worker
SIGTERMed in turn); a noisy neighbour (a fourth merchant floods ``tok_issuer_down``
creates while another's ``tok_issuer_timeout`` payments must finish within the issuer
deadline); a link outage (issue 16, ``idempay_tools._chaos_outage``: half the fleet's link
refuses every connection, those terminals sell offline under their offline policy, two of
them are SIGKILLed holding stored payments and rebooted, and everything stored is
forwarded once the link is back); a PostgreSQL backend SIGKILLed while it runs a create's
statement (``idempay_tools._chaos_pgkill``: the postmaster ends every backend and recovers;
a create cut so may have committed and is never answered 503). A 5-minute run holds every
kind at least once (worker and terminal kills three times), a short run (the ``make test``
variant) each kind once. Beside them: the SQLite disk-full episode
(``idempay_tools._chaos_diskfull``, its own server and disk).

The acquirer (``idempay_tools._chaos_acquirer``): the simulated acquirer host runs as a
process of its own for the whole run (the API and its sidecars reach it by
``IDEMPAY_ACQUIRER_URL``; ``IDEMPAY_ACQUIRER_TIMEOUT`` 10 s), with one of each of its
episodes per run: a latency spike, dropped answers, answers later than the acquirer
timeout, dropped connections, ``kill -9`` of the host (restarted on the same store and
port) and an outage (down, then up; 30 s when the run has room for it).

The schedule (``plan``), one for the whole run, in seconds from the fleet's start:

1. a warm-up (``min(15 s, duration / 10)``) with no fault;
2. the server's faults, each in its own slot of ``(duration − warm-up) / count`` seconds
   (order and offset in the slot from the seed), the link outage in the first slot (its
   window is set on the terminals' clocks when the fleet starts);
3. quiet windows: around each server fault whose checks assume a reachable acquirer
   (``NEEDS_ACQUIRER``: the link outage — its terminals' stored payments must be forwarded
   and processed; the noisy neighbour — its victims must be final within the issuer
   deadline), from ``QUIET_LEAD_S`` before it until its hold and its tail are over;
4. the acquirer's episodes, one at a time, each (hold + ``EPISODE_TAIL_S``) inside the time
   left free by the warm-up, the quiet windows and the run's last seconds — shortened in
   proportion when that time is short, never moved into a quiet window (past the end of
   the run instead, as a last resort). Server faults outside the quiet windows may
   overlap an episode.

As the run goes, ``Run._claim`` keeps the same rule when a fault runs late (a restore or a
slow recovery delays the faults after it on its thread): an episode waits while a fault of
``NEEDS_ACQUIRER`` runs (until it has recovered) or while the link outage is due before
the episode would be over; the noisy neighbour waits while an episode runs; a fault that
began late says so in its detail.

After the run the terminals stop selling and settle their journals, the completer and the
relay drain, the API stops (flushing its request events), a final export runs, and the
checks run: contract §8 on the database and the journals and, once the reversal-advice
queue has drained (waited for while the API still runs, bounded), on the acquirer's own
store — at most one 0200 per key, its net approvals equal to the approved transactions by
RRN, every ``acquirer_timeout`` decline advised (``idempay_tools.invariants``), and the
settlement reconciliation (``idempay_tools._chaos_settlement``): the acquirer's clearing
file of each day written from its store, landed in the run's lake and reconciled by the
DuckDB reference — no exception, and its matches the approved transactions one to one,
every outbox event relayed, nothing stuck processing, no 500 answered, no terminal process
died on its own, no payment refused for a skewed clock, no raw storage error after a send,
no stale answer after the restore, every victim of the flood final in time, and the lake
(``idempay_tools._chaos_lake``): every request event in the database in the lake exactly
once; and the offline checks (``_chaos_outage.check_offline``): every payment sold offline
forwarded and processed exactly once, or refused as the contract says, none left stored or
lost across a kill, the risk limits never exceeded. Time to recover (per fault): from the
injection until the component was back *and* work went through again
(``_chaos_report._RECOVERED_BY``).

Bounded (issue 22, ``idempay_tools._chaos_budget``): each phase (setup, fleet, settle,
probe, drain, stop, export, checks) has a deadline derived from ``--duration``, every wait
and command inside it is capped by that deadline, and a phase that overruns is named in the
output (and fails the run); the whole run has a deadline (``--deadline``, by default
derived from the duration), and a phase blocked past its deadline is interrupted
(SIGALRM). Every process the run starts is registered by PID
(``idempay_tools._chaos_reaper``): SIGTERM, SIGINT or SIGHUP stop them all, unmount the
disk-full episode's loop disk and remove the run's folder before the harness exits
(status 128 + the signal), and a watcher process does the same if the harness itself dies
without cleaning up (SIGKILL).

Exit status 0 only when every check holds. ``--report PATH`` writes the run as Markdown
(``docs/reliability.md`` under ``make chaos``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import httpx

from idempay_tools import _chaos_report as report
from idempay_tools._chaos_acquirer import (
    ACQUIRER_KINDS,
    ACQUIRER_TIMEOUT_S,
    EPISODE_TAIL_S,
    ChaosAcquirer,
    acquirer_plan,
    episode,
)
from idempay_tools._chaos_budget import (
    CLEANUP_S,
    Interrupted,
    Overrun,
    Timeline,
    install_signal_handlers,
    total_budget,
)
from idempay_tools._chaos_diskfull import Beside
from idempay_tools._chaos_fleet import Probe, Tally, TerminalProcess
from idempay_tools._chaos_lake import check_lake
from idempay_tools._chaos_outage import (
    KILL_BEFORE_END_S,
    KILL_DURING,
    OUTAGE_SHARE,
    Held,
    all_forwarded_since,
    check_offline,
    forwarded_between,
    outage_indices,
    stored_keys,
)
from idempay_tools._chaos_phases import Exporter, NoisyNeighbour, run_days
from idempay_tools._chaos_reaper import CLEAN, KEEP, sweep
from idempay_tools._chaos_services import (
    ROOT,
    Api,
    ChaosPostgres,
    ChaosRedis,
    Sidecar,
    Tracker,
    migrate_and_keys,
)
from idempay_tools._chaos_settlement import Settlement, check_settlement
from idempay_tools.chaos_proxy import ChaosProxy, ProxyThread
from idempay_tools.serve_process import say

_T = TypeVar("_T")

MERCHANTS = ("chaos-m1", "chaos-m2", "chaos-m3")
PROBE = "chaos-probe"
STEADY_LOSS = 0.035
BURST_LOSS = 0.30
NOISY = "chaos-noisy"
SKEWS = (-120.0, 120.0, 900.0)  # terminals 0, 1, 2: behind; ahead within and beyond 5 min
ISSUER_DEADLINE_S = 30.0
KINDS = (
    "worker_kill",
    "terminal_kill",
    "postgres_restart",
    "redis_restart",
    "loss_burst",
    "journal_full",
    "db_restore",
    "rolling_restart",
    "noisy_neighbour",
    "link_outage",
    "backend_kill",
)
LONG_COUNTS = {
    "worker_kill": 3,
    "terminal_kill": 3,
    "postgres_restart": 1,
    "redis_restart": 1,
    "loss_burst": 2,
    "journal_full": 1,
    "db_restore": 1,
    "rolling_restart": 1,
    "noisy_neighbour": 1,
    "link_outage": 1,  # one outage window per run (the terminals' OutageLink holds one)
    "backend_kill": 2,
}
BACKEND_WAIT_S = 30.0  # a create's statement must be running within this to be cut (they are brief)
ADVICE_DRAIN_S = 150.0  # the reversal-advice queue must drain within this after the run
RECOVER_TIMEOUT_S = 90.0
JOURNAL_FULL_BYTES = 4096  # RLIMIT_FSIZE: every journal write past the first page fails
RESTORE_FLUSH_MARGIN_S = 1.0  # events answered just before a dump, flushed after it
SIGKILL_EVENT_LOSS_S = 5.0  # a SIGKILLed worker's unflushed events: answered this long before
# The server's faults whose checks assume a reachable acquirer, and how long after the end
# of their hold it must stay reachable (planned; the run also waits for them to finish):
# the link outage until the terminals have forwarded what they stored (their payments and
# the offline checks go through the acquirer); the noisy neighbour until its victims are
# final (each waits out the acquirer timeout, then its decline: contract §2's deadline).
NEEDS_ACQUIRER = {
    "link_outage": 10.0,
    "noisy_neighbour": ACQUIRER_TIMEOUT_S + 5.0,
}
QUIET_LEAD_S = 1.0  # a quiet window opens this long before its fault


def event_loss_windows(
    faults: list[Fault], restores: list[tuple[float, float]]
) -> list[tuple[float, float]]:
    """When an answered create's request event may be lost, as documented (docs/analytics.md),
    read on the time the create was answered (its event is queued then): a SIGKILLed
    worker's unflushed events — those of the last ``SIGKILL_EVENT_LOSS_S``, or
    since the start of a storage outage the kill followed closely (the writer holds events
    while it cannot flush) — and whatever a restore takes back, from a flush interval's
    margin before the dump to the API's stop."""
    outages = [
        (f.injected, f.recovered or f.healed or f.injected)
        for f in faults
        if f.kind in ("postgres_restart", "db_restore", "backend_kill") and f.injected
    ]
    windows: list[tuple[float, float]] = []
    for kill in (f.injected for f in faults if f.kind == "worker_kill" and f.injected):
        start = kill - SIGKILL_EVENT_LOSS_S
        for began, ended in outages:
            if began <= kill and kill - ended <= SIGKILL_EVENT_LOSS_S:
                start = min(start, began - 1.0)
        windows.append((start, kill + 0.5))
    windows += [(dumped - RESTORE_FLUSH_MARGIN_S, stopped) for dumped, stopped in restores]
    return windows


STORAGE_DOWN_MARGIN_S = 1.0  # a create sent just before a crash may meet it on the server


def storage_down_windows(faults: list[Fault]) -> list[tuple[float, float]]:
    """When the API's database was unreachable (``_chaos_lake``: a create answered 503 then
    may have been refused before its merchant was known, and has no request event): from
    each Postgres crash until the probe's first success after it (or its restart)."""
    return [
        (f.injected - STORAGE_DOWN_MARGIN_S, f.recovered or f.healed or time.monotonic())
        for f in faults
        if f.kind in ("postgres_restart", "backend_kill") and f.injected
    ]


@dataclass
class Fault:
    kind: str
    at_s: float  # planned, from the start of the fleet
    hold_s: float  # how long the component stays down / the burst lasts
    injected: float = 0.0  # monotonic
    finished: bool = False  # its injection and recovery wait are over
    healed: float | None = None
    recovered: float | None = None
    probe_failures: int = 0
    detail: str = ""

    @property
    def recover_s(self) -> float | None:
        return None if self.recovered is None else self.recovered - self.injected


def plan(duration_s: float, seed: int) -> list[Fault]:
    """The run's one fault schedule, in seconds from the fleet's start. The server's faults
    first: each in its own slot after a warm-up (``(duration − warm-up) / count`` each),
    order and offsets drawn from ``seed``, the link outage in the first slot. At least
    5 minutes: ``LONG_COUNTS``; shorter: each kind once. Then the acquirer's episodes
    (``_chaos_acquirer.acquirer_plan``), in the time the server's schedule leaves them: never
    inside a quiet window — from ``QUIET_LEAD_S`` before each fault of ``NEEDS_ACQUIRER``
    until its hold and its ``NEEDS_ACQUIRER`` tail are over — nor in the warm-up, and one
    at a time; server faults other than those may overlap them (their recovery is then
    read with the acquirer's episode on: the report's "at s" column shows both). The run
    keeps to the same rule when a fault runs late (``Run._claim``)."""
    rng = random.Random(f"{seed}:plan")  # the server's faults (the acquirer's: their own)
    counts = LONG_COUNTS if duration_s >= 300 else dict.fromkeys(KINDS, 1)
    kinds = [kind for kind, n in counts.items() for _ in range(n)]
    rng.shuffle(kinds)
    if "link_outage" in kinds:  # the first slot: its window is set on the terminals' clock
        kinds.remove("link_outage")  # when the fleet starts, so no fault may overrun into it
        kinds.insert(0, "link_outage")
    warmup = min(15.0, duration_s * 0.1)
    slot = (duration_s - warmup) / len(kinds)
    holds = {
        "worker_kill": 0.0,
        "terminal_kill": 0.0,
        "postgres_restart": min(4.0, slot * 0.3),
        "redis_restart": min(8.0, slot * 0.4),
        "loss_burst": min(15.0, slot * 0.5),
        "journal_full": min(10.0, slot * 0.4),
        "db_restore": min(10.0, slot * 0.4),  # selling between the dump and the restore
        "rolling_restart": 0.0,
        "noisy_neighbour": min(20.0, slot * 0.6),
        "link_outage": min(20.0, slot * 0.8),
        "backend_kill": 0.0,
    }
    server = [
        Fault(kind, warmup + i * slot + rng.uniform(0.0, slot * 0.2), holds[kind])
        for i, kind in enumerate(kinds)
    ]
    episodes = acquirer_plan(duration_s, seed, quiet_windows(server))
    return server + [Fault(kind, at, hold) for kind, at, hold in episodes]


def quiet_windows(faults: list[Fault]) -> list[tuple[float, float]]:
    """When no acquirer episode may run (s from the fleet's start): around each fault of
    ``NEEDS_ACQUIRER``, from ``QUIET_LEAD_S`` before it until its hold and tail are over."""
    return [
        (f.at_s - QUIET_LEAD_S, f.at_s + f.hold_s + NEEDS_ACQUIRER[f.kind])
        for f in faults
        if f.kind in NEEDS_ACQUIRER
    ]


@dataclass
class Run:
    """Everything one chaos run starts, and what it saw."""

    args: argparse.Namespace
    root: Path
    timeline: Timeline
    tracker: Tracker
    pg: ChaosPostgres
    redis: ChaosRedis
    api: Api
    sidecars: list[Sidecar]
    proxy: ProxyThread
    terminals: list[TerminalProcess]
    probe: Probe
    tally: Tally
    faults: list[Fault]
    rng: random.Random
    env: dict[str, str]
    exporter: Exporter
    noisy: NoisyNeighbour
    acquirer: ChaosAcquirer
    outage_ids: list[str] = field(default_factory=list)  # terminals whose link goes down
    held: list[Held] = field(default_factory=list)  # killed in the outage, holding stored
    started: float = 0.0
    fleet_s: float = 0.0
    errors: list[str] = field(default_factory=list)
    restores: list[tuple[float, float]] = field(default_factory=list)  # (dump, API stopped)
    restores_wall: list[tuple[float, float]] = field(default_factory=list)  # the same, unix
    after_restore: dict[str, int] = field(default_factory=dict)  # key → lookup status
    threads: list[threading.Thread] = field(default_factory=list)  # the fault schedules
    running: list[Fault] = field(default_factory=list)  # claimed, not yet finished
    _claims: threading.Lock = field(default_factory=threading.Lock)

    def _left(self, cap: float = RECOVER_TIMEOUT_S) -> float:
        """What a fault's wait may take: ``cap``, never past the fleet phase's deadline."""
        return self.timeline.left(cap, phase="fleet")

    def _until(self, start: float, cap: float = RECOVER_TIMEOUT_S) -> float:
        """A fault's deadline (monotonic): ``start + cap``, or the fleet's, if sooner."""
        return min(start + cap, self.timeline.deadline("fleet"))

    # ------------------------------------------------------------------ the faults
    def inject(self, fault: Fault) -> None:
        fault.injected = time.monotonic()
        if fault.kind in ACQUIRER_KINDS:
            self._acquirer_episode(fault)
        else:
            getattr(self, f"_{fault.kind}")(fault)
        if fault.recovered is None and fault.healed is not None:
            deadline = self._until(fault.healed)
            while fault.recovered is None and time.monotonic() < deadline:
                fault.recovered = self.probe.first_success_after(fault.healed)
                time.sleep(0.05)
        end = fault.recovered or time.monotonic()
        fault.probe_failures = self.probe.failures_between(fault.injected, end)
        fault.finished = True
        if fault.recovered is None and self.timeline.expired("fleet"):
            cut = "not recovered" if fault.healed is not None else "not healed"
            overrun = self.timeline.overrun(f"{fault.kind} {cut} by then", phase="fleet")
            self.errors.append(str(overrun))

    def _worker_kill(self, fault: Fault) -> None:
        pid = self.api.kill_worker(self.rng)
        fault.detail = f"SIGKILL uvicorn worker pid {pid}"
        if self.api.wait_workers(without=pid, timeout=self._left()):
            fault.healed = time.monotonic()

    def _terminal_kill(self, fault: Fault) -> None:
        victim = self.rng.choice(self.terminals)
        fault.detail = f"SIGKILL {victim.terminal_id}, rebooted on its journal"
        killed = victim.kill()
        deadline = self._until(killed)
        while time.monotonic() < deadline:
            if victim.booted_at > killed:
                fault.healed = fault.recovered = victim.booted_at
                return
            time.sleep(0.05)

    def _postgres_restart(self, fault: Fault) -> None:
        fault.detail = f"pg_ctl stop -m immediate; down {fault.hold_s:.0f} s; start"
        self.pg.crash()
        time.sleep(min(fault.hold_s, self._left()))
        self.pg.start()
        fault.healed = time.monotonic()

    def _backend_kill(self, fault: Fault) -> None:
        """``kill -9`` of a PostgreSQL backend while it runs a create's statement: the
        postmaster ends every backend and runs crash recovery."""
        from idempay_tools._chaos_pgkill import cut_create_backend_sync

        pid = cut_create_backend_sync(
            self.pg.url, how="kill", batches_only=False, wait_s=min(BACKEND_WAIT_S, self._left())
        )
        if pid is None:
            fault.detail = f"no backend ran a create's statement within {BACKEND_WAIT_S:.0f} s"
            return
        fault.detail = f"kill -9 of backend pid {pid} running a create (crash recovery)"
        fault.healed = time.monotonic()

    def _acquirer_episode(self, fault: Fault) -> None:
        """One of the acquirer's episodes (``idempay_tools._chaos_acquirer``)."""
        detail, healed = episode(self.acquirer, fault.kind, fault.hold_s, left=lambda: self._left())
        fault.detail = detail
        fault.healed = healed

    def _redis_restart(self, fault: Fault) -> None:
        fault.detail = f"SIGKILL redis-server; down {fault.hold_s:.0f} s; start empty"
        self.redis.kill()
        time.sleep(min(fault.hold_s, self._left()))
        self.redis.start()
        fault.healed = time.monotonic()

    def _journal_full(self, fault: Fault) -> None:
        """The terminal's disk fills and frees again (1 s full, 0.3 s free) for ``hold_s``:
        the limit lands at random moments of its payments, some of them in flight."""
        victim = self.rng.choice(self.terminals)
        pids: set[int] = set()
        flips = 0
        until = min(time.monotonic() + fault.hold_s, self._until(time.monotonic()))
        try:
            while time.monotonic() < until:
                if (pid := victim.limit_journal(JOURNAL_FULL_BYTES)) is not None:
                    pids.add(pid)
                time.sleep(self.rng.uniform(0.5, 1.0))
                victim.limit_journal(None)
                flips += 1
                time.sleep(self.rng.uniform(0.1, 0.3))
        finally:
            victim.limit_journal(None)
        fault.detail = (
            f"{victim.terminal_id} (pid {', '.join(str(p) for p in sorted(pids))}): "
            f"RLIMIT_FSIZE {JOURNAL_FULL_BYTES} B {flips} times over {fault.hold_s:.0f} s "
            "(every journal write fails while it holds)"
        )
        fault.healed = time.monotonic()
        deadline = self._until(fault.healed)
        while time.monotonic() < deadline:
            if (settled := victim.settled_since(fault.healed)) is not None:
                fault.recovered = settled
                return
            time.sleep(0.05)

    def _db_restore(self, fault: Fault) -> None:
        """Take a dump; keep selling for ``hold_s``; stop the API and its sidecars (nothing
        else may write while the database goes back); restore the dump;
        ``idempay admin new-epoch``; start them again. Redis keeps everything it cached."""
        steps: dict[str, float] = {}
        dumped = mark = time.monotonic()

        def step(name: str) -> None:
            nonlocal mark
            now = time.monotonic()
            steps[name], mark = now - mark, now
            fault.detail = "; ".join(f"{k} {v:.1f} s" for k, v in steps.items())

        dump = self.pg.dump(f"restore-{len(self.restores)}")
        step("pg_dump")
        time.sleep(min(fault.hold_s, self._left()))
        mark = time.monotonic()
        for process in (self.api, *self.sidecars):
            process.stop(timeout=min(15.0, max(1.0, self._left())))
        stopped = time.monotonic()
        step("API stop")
        self.restores.append((dumped, stopped))
        wall = time.time() - stopped  # unix − monotonic
        self.restores_wall.append((dumped + wall - RESTORE_FLUSH_MARGIN_S, stopped + wall))
        self.pg.restore(dump)
        step("pg_restore")
        epoch = subprocess.run(
            [sys.executable, "-m", "api", "admin", "new-epoch"], cwd=ROOT,
            env={**os.environ, **self.env}, capture_output=True, text=True,
            timeout=self.tracker.timeout("idempay admin new-epoch", 60.0),
        )  # fmt: skip
        step("new-epoch")
        said = (epoch.stdout + epoch.stderr).strip().splitlines()
        if epoch.returncode != 0:
            self.errors.append(f"idempay admin new-epoch failed: {' '.join(said)[-300:]}")
        self.api.start(timeout=self._left())
        step("API start")
        self._look_up_restored(dumped, stopped)
        step("lookups")
        for sidecar in self.sidecars:
            sidecar.launch()
        fault.healed = time.monotonic()
        fault.detail = (
            f"pg_dump, {fault.hold_s:.0f} s of selling, API stopped, pg_restore, "
            f"`idempay admin new-epoch` ({'ok' if epoch.returncode == 0 else 'FAILED'}), "
            f"API started; Redis kept ({fault.detail})"
        )

    def _look_up_restored(self, dumped: float, stopped: float, most: int = 100) -> None:
        """Before anything else runs on the restored database: look up the payments that
        were processed between the dump and the stop. The database has none of those
        committed after the dump; an answer 200 for one of them came from Redis (contract §3.6).
        At most ``most`` of them, within 30 s (and the fleet's deadline)."""
        api_keys = {t.terminal_id: t.config.api_key for t in self.terminals}
        processed = [
            key
            for key, at in list(self.tally.when.items())
            if dumped <= at <= stopped and self.tally.outcomes.get(key) in ("approved", "declined")
        ]
        deadline = self._until(time.monotonic(), 30.0)
        with httpx.Client(base_url=self.api.url, timeout=5.0) as http:
            for key in processed[:most]:
                if time.monotonic() >= deadline:
                    break
                api_key = api_keys[self.tally.terminal_of[key]]
                try:
                    answer = http.get(
                        f"/v1/transactions/{key}", headers={"Authorization": f"Bearer {api_key}"}
                    )
                except httpx.HTTPError:
                    continue
                self.after_restore[key] = answer.status_code

    def _rolling_restart(self, fault: Fault) -> None:
        pids = sorted(self.api.worker_pids())
        fault.detail = f"SIGTERM each of {len(pids)} workers in turn, after its replacement"
        for pid in pids:
            self.api.terminate_worker(pid)
            if not self.api.wait_workers(without=pid, timeout=self._left()):
                return
        fault.healed = time.monotonic()

    def _noisy_neighbour(self, fault: Fault) -> None:
        noisy = self.noisy
        fault.detail = (
            f"{NOISY}: {noisy.connections} connections of tok_issuer_down creates for "
            f"{fault.hold_s:.0f} s; {noisy.victims} tok_issuer_timeout payments of another "
            "merchant meanwhile"
        )
        fault.healed = noisy.run(fault.hold_s, until=self.timeline.deadline("fleet"))
        finished = [v.finished for v in noisy.results]
        if noisy.results and all(f is not None for f in finished):
            fault.recovered = max(f for f in finished if f is not None)
        fault.detail += f"; flood answers {dict(sorted(noisy.flood_sent.items()))}"
        if unreachable := sum(v.unreachable for v in noisy.results):
            fault.detail += f"; victims answered 'Acquirer unreachable' {unreachable} times"

    def _loss_burst(self, fault: Fault) -> None:
        fault.detail = f"link loss {STEADY_LOSS:.1%} → {BURST_LOSS:.0%} for {fault.hold_s:.0f} s"
        self.proxy.proxy.loss = BURST_LOSS
        try:
            time.sleep(min(fault.hold_s, self._left()))
        finally:
            self.proxy.proxy.loss = STEADY_LOSS
        fault.healed = time.monotonic()
        deadline = self._until(fault.healed)
        while time.monotonic() < deadline:
            after = [t for t in list(self.tally.completed) if t >= fault.healed]
            if after:
                fault.recovered = min(after)
                return
            time.sleep(0.05)

    def _link_outage(self, fault: Fault) -> None:
        """The outage's window is in the terminals' own link (``OutageLink``, from the plan);
        here: two of its terminals SIGKILLed holding stored payments, then the wait until
        everything stored was forwarded (``idempay_tools._chaos_outage``)."""
        down = self.started + fault.at_s
        up = down + fault.hold_s
        fault.injected = down
        during = self._kill_holding(down + KILL_DURING * fault.hold_s, up, "40 % into the outage")
        last = self._kill_holding(
            up - KILL_BEFORE_END_S, up, "just before the link came back", avoid=during
        )
        time.sleep(max(0.0, min(up - time.monotonic(), self._left())))
        fault.healed = up
        killed = "; ".join(
            f"SIGKILL {h.terminal} holding {len(h.keys)} stored ({h.when})" for h in self.held
        )
        fault.detail = (
            f"{', '.join(self.outage_ids)}: every connection refused for {fault.hold_s:.0f} s, "
            f"selling offline (OfflinePolicy); {killed or 'no terminal held a stored payment'}"
        )
        if during is None or last is None:
            self.errors.append(
                "link_outage: no terminal of the outage held a stored payment to be killed with"
            )
        deadline = self._until(up)
        while time.monotonic() < deadline:
            done = all_forwarded_since(self.tally.exposure, self.outage_ids, up)
            if done is not None:
                fault.recovered = done
                break
            time.sleep(0.1)
        fault.detail += f"; {len(self.tally.offline)} sold offline (reported by the terminals)"

    def _kill_holding(
        self, at: float, up: float, when: str, *, avoid: str | None = None
    ) -> str | None:
        """At ``at`` (monotonic), SIGKILL the outage terminal holding the most stored
        payments (another than ``avoid`` when one holds any), and record what it held."""
        time.sleep(max(0.0, min(at - time.monotonic(), self._left())))
        victims = [t for t in self.terminals if t.terminal_id in self.outage_ids]
        while True:
            holding = sorted(
                ((len(stored_keys(t.journal)), t.terminal_id != avoid, t) for t in victims),
                key=lambda item: (item[1], item[0]),
                reverse=True,
            )
            holding = [h for h in holding if h[0] > 0]
            if holding or time.monotonic() >= min(up, self.timeline.deadline("fleet")):
                break
            time.sleep(0.1)
        if not holding:
            return None
        victim = holding[0][2]
        pid = victim.pid
        killed = victim.kill()
        while pid is not None and victim.pid == pid and time.monotonic() < killed + 5.0:
            time.sleep(0.01)  # dead, so its journal holds what it held
        self.held.append(Held(victim.terminal_id, when, killed, stored_keys(victim.journal)))
        return victim.terminal_id

    # ------------------------------------------------------------------ the run
    def fleet(self) -> None:
        """Start the fleet, inject the faults on schedule, then stop the terminals."""
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.started = time.monotonic()
        wall = time.time()
        outage = next((f for f in self.faults if f.kind == "link_outage"), None)
        for terminal in self.terminals:
            if outage is not None:
                terminal.config = replace(terminal.config, outage_start=wall + outage.at_s)
            terminal.start()
        self.probe.start()
        self.exporter.start()
        timed = [f for f in self.faults if f.kind == "link_outage"]  # on the terminals' clock
        acquirer = [f for f in self.faults if f.kind in ACQUIRER_KINDS]  # their own slots
        server = [f for f in self.faults if f not in timed and f not in acquirer]
        for name, faults in (("faults", sorted(server, key=lambda f: f.at_s)),
                             ("outage", timed),
                             ("acquirer", sorted(acquirer, key=lambda f: f.at_s))):  # fmt: skip
            thread = threading.Thread(target=self._schedule, args=(faults,), name=name, daemon=True)
            thread.start()
            self.threads.append(thread)
        progress = Progress(
            TextColumn("[bold]chaos"),
            BarColumn(),
            TextColumn("{task.completed:.0f}/{task.total:.0f} s"),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
        )
        with progress:
            task = progress.add_task("run", total=self.args.duration, status="")
            while (elapsed := time.monotonic() - self.started) < self.args.duration:
                done = sum(1 for f in self.faults if f.injected)
                status = f"{len(self.tally.outcomes)} payments · {done}/{len(self.faults)} faults"
                progress.update(task, completed=elapsed, status=status)
                time.sleep(0.5)
            progress.update(task, completed=self.args.duration)
        for thread in self.threads:  # a fault still recovering finishes first (bounded)
            thread.join(self.timeline.left())
        self.fleet_s = time.monotonic() - self.started
        if any(thread.is_alive() for thread in self.threads):
            running = [f.kind for f in self.faults if f.injected and not f.finished]
            raise self.timeline.overrun(
                f"a fault was still being injected or recovered: {', '.join(running) or '?'}"
            )

    def _schedule(self, faults: list[Fault]) -> None:
        for fault in faults:
            wait = self.started + fault.at_s - time.monotonic()
            if wait > 0:
                time.sleep(min(wait, self._left()))
            if self.tracker.closing.is_set():
                return
            waited = self._claim(fault)
            if self.tracker.closing.is_set():
                self._release(fault)
                return
            if self.timeline.expired("fleet"):
                fault.detail = "not injected: the fleet phase's deadline passed"
                fault.finished = True
                self._release(fault)
                overrun = self.timeline.overrun(f"{fault.kind} not injected", phase="fleet")
                self.errors.append(str(overrun))
                continue
            try:
                self.inject(fault)
            except Exception as exc:  # reported, and the run fails
                self.errors.append(f"{fault.kind}: {type(exc).__name__}: {exc}")
                fault.detail = f"{fault.detail} — FAILED: {exc}"
            finally:
                fault.finished = True
                self._release(fault)
            if waited:
                fault.detail += f" ({waited})"

    # The one schedule's rule (``plan``), kept as the run goes, since a fault may run late
    # (a restore or a slow recovery delays the faults after it on its thread): never an
    # acquirer episode and a fault of NEEDS_ACQUIRER at once. The link outage cannot wait
    # (its window is on the terminals' clocks): an episode does not begin while it is due
    # before the episode would be over, nor until it has finished (its stored payments
    # forwarded). Between an episode and the noisy neighbour, the first to begin goes
    # first and the other waits until it has finished (recovered).
    def _blocker(self, fault: Fault, now: float) -> Fault | None:
        if fault.kind in ACQUIRER_KINDS:
            over = now + fault.hold_s + EPISODE_TAIL_S + QUIET_LEAD_S
            return next(
                (
                    f
                    for f in self.faults
                    if f.kind in NEEDS_ACQUIRER
                    and not f.finished
                    and (
                        self._is_running(f)
                        or (f.kind == "link_outage" and self.started + f.at_s < over)
                    )
                ),
                None,
            )
        if fault.kind in NEEDS_ACQUIRER and fault.kind != "link_outage":
            return next((f for f in self.running if f.kind in ACQUIRER_KINDS), None)
        return None

    def _claim(self, fault: Fault) -> str:
        """Wait until ``fault`` may begin under the schedule's rule (at most until the
        fleet's deadline or the run closing), then mark it running. What it waited for
        ("" when it did not)."""
        began = time.monotonic()
        blocker = None
        while True:
            with self._claims:
                now = time.monotonic()
                found = self._blocker(fault, now)
                if found is None or self.tracker.closing.is_set() or now >= self._fleet_end():
                    self.running.append(fault)
                    break
            blocker = found
            time.sleep(0.1)
        late = time.monotonic() - began
        if blocker is None or late < 0.5:
            return ""
        return f"began {late:.1f} s late: waited for {blocker.kind} to be over"

    def _fleet_end(self) -> float:
        return self.timeline.deadline("fleet")

    def _is_running(self, fault: Fault) -> bool:
        return any(f is fault for f in self.running)

    def _release(self, fault: Fault) -> None:
        with self._claims:
            self.running[:] = [f for f in self.running if f is not fault]

    def settle(self) -> None:
        """Stop selling: every terminal settles its journal and exits (one deadline for
        all of them); the export loop and the probe stop."""
        (self.root / "stop").touch()
        for terminal in self.terminals:
            if not terminal.join(self.timeline.left()):
                terminal.terminate()
                self.errors.append(
                    str(
                        self.timeline.overrun(
                            f"{terminal.terminal_id} had not settled its journal (killed)"
                        )
                    )  # fmt: skip
                )
        self.probe.stop()
        if not self.exporter.stop(timeout=min(15.0, self.timeline.left())):
            self.errors.append(str(self.timeline.overrun("the export loop did not stop")))
        for terminal in self.terminals:
            self.errors.extend(terminal.unexpected_exits)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m idempay_tools.chaos", description=__doc__)
    parser.add_argument("--duration", type=float, default=300.0, help="fleet seconds")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--terminals", type=int, default=12)
    parser.add_argument("--workers", type=int, default=2, help="API worker processes")
    parser.add_argument("--report", type=Path, help="write the run as Markdown here")
    parser.add_argument("--keep", action="store_true", help="keep the run's folder")
    parser.add_argument(
        "--deadline",
        type=float,
        help="the whole run's deadline in seconds, cleanup excluded (default: derived from "
        "--duration: 530 s for 90 s, 840 s for 300 s)",
    )
    return parser


def _env(pg: ChaosPostgres, redis: ChaosRedis, root: Path, acquirer_url: str) -> dict[str, str]:
    return {
        "IDEMPAY_ACQUIRER_URL": acquirer_url,  # the run's own host, never a child
        "IDEMPAY_ACQUIRER_TIMEOUT": str(ACQUIRER_TIMEOUT_S),
        "IDEMPAY_DATABASE_URL": pg.url,
        "IDEMPAY_REDIS_URL": redis.url,
        "IDEMPAY_REDIS_PREFIX": "chaos:",
        "IDEMPAY_VAR_DIR": str(root / "var"),
        "IDEMPAY_COMPLETER_ENABLED": "false",  # the completer runs as its own process
        "IDEMPAY_COMPLETER_INTERVAL": "0.5",
        "IDEMPAY_DB_POOL_SIZE": "8",
        "IDEMPAY_RATE_LIMIT": "100000/second",
        "IDEMPAY_RATE_LIMIT_TERMINAL": "100000/second",
        "IDEMPAY_LOG_LEVEL": "WARNING",
        "IDEMPAY_ISSUER_DEADLINE": str(ISSUER_DEADLINE_S),
    }


def _bounded(coroutine: Coroutine[Any, Any, _T], timeline: Timeline, what: str) -> _T:
    """Run ``coroutine`` within the current phase's time left; ``Overrun`` otherwise."""

    async def run() -> _T:
        return await asyncio.wait_for(coroutine, timeline.left())

    try:
        return asyncio.run(run())
    except TimeoutError as exc:
        raise timeline.overrun(what) from exc


class Harness:
    """One run from nothing to the verdict, and the cleanup that stops everything it
    started whatever happened (``close``)."""

    def __init__(self, args: argparse.Namespace, root: Path, timeline: Timeline) -> None:
        self.args, self.root, self.timeline = args, root, timeline
        self.tracker = Tracker(root, lambda cap: timeline.left(cap))
        self.pg = ChaosPostgres(root, self.tracker)
        self.redis = ChaosRedis(root, self.tracker)
        self.servers: list[Api | Sidecar] = []
        self.proxy: ProxyThread | None = None
        self.run: Run | None = None
        self.acquirer: ChaosAcquirer | None = None
        self.disk_full: Beside | None = None

    def execute(self, argv: list[str] | None) -> int:
        from idempay_tools.simulate import FleetConfig

        args, root, timeline, tracker = self.args, self.root, self.timeline, self.tracker
        with timeline.phase("setup"):
            self.pg.init()
            self.pg.start()
            self.redis.start()
            keys = migrate_and_keys(self.pg.url, [*MERCHANTS, PROBE, NOISY])
            (root / "logs").mkdir()
            acquirer = self.acquirer = ChaosAcquirer(
                root, args.seed, lambda pid, label: tracker.registry.add(pid, label, group=True)
            )
            acquirer.start(timeout=timeline.left(30.0))
            env = _env(self.pg, self.redis, root, acquirer.url)
            api = Api(env, root / "logs" / "api.log", workers=args.workers, cwd=ROOT)
            api.tracker = tracker
            self.servers.append(api)
            api.start(timeout=90.0)
            sidecars = [
                Sidecar([name], env, root / "logs" / f"{name}.log", tracker)
                for name in ("completer", "relay")
            ]
            for sidecar in sidecars:
                self.servers.append(sidecar)
                sidecar.launch()
            proxy = self.proxy = ChaosProxy(
                target_host="127.0.0.1",
                target_port=api.port,
                seed=args.seed,
                loss=STEADY_LOSS,
                drop_request_ratio=0.5,
                reset_ratio=0.2,
            ).run_in_thread()
            faults = plan(args.duration, args.seed)
            hold = next((f.hold_s for f in faults if f.kind == "link_outage"), 0.0)
            tally = Tally()
            terminals = []
            for index in range(args.terminals):
                merchant = MERCHANTS[index % len(MERCHANTS)]
                config = FleetConfig(
                    base_url=f"http://127.0.0.1:{proxy.port}",
                    api_key=keys[merchant][1],
                    workdir=root / "journals",
                    terminals=args.terminals,
                    via_proxy=True,
                    seed=args.seed,
                    deadline_s=30.0,
                    timeout_s=5.0,
                    max_backoff=1.0,
                    abort_grace_s=15.0,
                    terminal_prefix="CHAOS",
                    clock_skew_s=SKEWS[index] if index < len(SKEWS) else 0.0,
                    outage_s=hold,  # the outage start is set when the fleet starts
                    outage_share=OUTAGE_SHARE,
                )
                config.workdir.mkdir(parents=True, exist_ok=True)
                terminals.append(TerminalProcess(config, index, root / "stop", tally, tracker))
            outage = outage_indices(args.seed, len(terminals)) if hold else []
            outage_ids = [terminals[i].terminal_id for i in outage]
            run = self.run = Run(
                args=args,
                root=root,
                timeline=timeline,
                tracker=tracker,
                pg=self.pg,
                redis=self.redis,
                api=api,
                sidecars=sidecars,
                proxy=proxy,
                terminals=terminals,
                probe=Probe(api.url, keys[PROBE][1]),
                tally=tally,
                faults=faults,
                rng=random.Random(f"{args.seed}:victims"),
                env=env,
                exporter=Exporter(
                    env, root / "lake", root / "logs" / "export.log", tracker=tracker
                ),
                noisy=NoisyNeighbour(
                    api.url, keys[NOISY][1], keys[MERCHANTS[1]][1], deadline_s=ISSUER_DEADLINE_S
                ),
                outage_ids=outage_ids,
                acquirer=acquirer,
            )
        with timeline.phase("fleet"):
            disk_full = self.disk_full = Beside(  # SQLite's disk, its own server
                root / "diskfull", run.errors, tracker.registry
            )
            run.fleet()
            disk_full.finish(timeline.left())
        with timeline.phase("settle"):
            run.settle()
            proxy_stats = dict(proxy.stats)
            self._stop_proxy()
        with timeline.phase("probe"):
            probe_outcome = run.probe.settle(timeout=timeline.left())
            if probe_outcome.get("unsettled"):
                self._overran(f"{probe_outcome['unsettled']} probe keys unsettled")
        ids = [keys[name][0] for name in MERCHANTS]
        others = [keys[PROBE][0], keys[NOISY][0]]
        with timeline.phase("drain"):
            drained = _bounded(
                report.drain(self.pg.url, [*ids, *others], within=timeline.left()),
                timeline,
                "the completer and relay drain",
            )
            if drained.processing_left or drained.outbox_unsent:
                self._overran("keys still processing or outbox events unsent")
            if not acquirer.alive():
                run.errors.append("the acquirer host exited on its own")
            advices = _bounded(
                report.drain_advices(
                    self.pg.url, [*ids, *others], within=timeline.left(ADVICE_DRAIN_S)
                ),
                timeline,
                "the reversal-advice queue's drain",
            )
        with timeline.phase("stop"):
            for sidecar in sidecars:
                if not sidecar.alive():
                    run.errors.append(f"{sidecar.args[0]} exited on its own")
            if not api.alive():
                run.errors.append("the API supervisor exited on its own")
            for process in (api, *sidecars):
                process.stop(timeout=max(1.0, min(15.0, timeline.left())))
        with timeline.phase("export"):
            say("chaos: the final export")
            if not run.exporter.export(cap=timeline.left()):
                run.errors.append("the final export failed (logs/export.log)")
                if timeline.expired():
                    self._overran("the final export")
        with timeline.phase("checks"):
            _write_probe_log(run, self.root / "probe-creates.tsv")
            result = self._check(run, keys, ids, proxy_stats, probe_outcome, drained, advices, argv)
        report.show(result)
        if args.report:
            args.report.write_text(report.markdown(result) + _kept_sections(args.report))
            say(f"chaos: report written to {args.report}")
        say("chaos: " + ("PASSED" if result.ok else "FAILED"))
        return 0 if result.ok else 1

    def _overran(self, what: str) -> None:
        assert self.run is not None
        self.run.errors.append(str(self.timeline.overrun(what)))

    def _check(
        self,
        run: Run,
        keys: dict[str, tuple[str, str]],
        ids: list[str],
        proxy_stats: dict[str, int],
        probe_outcome: dict[str, int],
        drained: report.Drained,
        advices: report.AdviceDrain,
        argv: list[str] | None,
    ) -> report.Result:
        args, tally, timeline = self.args, run.tally, self.timeline
        reported = dict(tally.outcomes)
        reported.update({v.key: v.status for v in run.noisy.results if v.status != "unsettled"})
        restored_away = {
            key for key, at in tally.when.items() if any(a <= at <= b for a, b in run.restores)
        }
        journals = [t.journal for t in run.terminals]
        restored_away |= forwarded_between(journals, run.restores_wall)  # advices forwarded then
        checks = _bounded(
            report.check(
                self.pg.url,
                merchants=ids,
                probe=keys[PROBE][0],
                noisy=keys[NOISY][0],
                reported=reported,
                restored_away=restored_away,
                journals=[t.journal for t in run.terminals],
                ask=[key for _, key, kind in tally.journal_failures if key],
                held_after_restore=[k for k, code in run.after_restore.items() if code == 200],
                acquirer_store=run.acquirer.store,
                acquirer_exempt=report.wall_windows(run.restores_wall),
            ),
            timeline,
            "contract §8 on the database and the journals",
        )
        lake = _bounded(
            check_lake(
                self.pg.url,
                self.root / "lake",
                probe_merchant=keys[PROBE][0],
                probe_creates=run.probe.creates,
                exempt_windows=event_loss_windows(run.faults, run.restores),
                storage_down=storage_down_windows(run.faults),
                origin=run.started,
            ),
            timeline,
            "the lake's request-event check",
        )
        settlement = self._settle(run)
        offline = _bounded(
            check_offline(
                self.pg.url,
                merchants=ids,
                journals=[t.journal for t in run.terminals],
                accepted=dict(tally.offline),
                held=run.held,
                exposures={k: list(v) for k, v in tally.exposure.items()},
                restored_away=restored_away,
            ),
            timeline,
            "the offline checks",
        )
        skewed = {
            t.terminal_id: t.config.clock_skew_s for t in run.terminals if t.config.clock_skew_s
        }
        return report.Result(
            seed=args.seed,
            duration_s=args.duration,
            fleet_s=run.fleet_s,
            terminals=args.terminals,
            workers=args.workers,
            faults=run.faults,
            skewed=skewed,
            lake=lake,
            offline=offline,
            outage_terminals=list(run.outage_ids),
            held=list(run.held),
            exports=dict(run.exporter.runs),
            noisy=run.noisy,
            journal_failures=list(tally.journal_failures),
            refused_skewed=sum(
                1
                for key, status in tally.outcomes.items()
                if status == "rejected" and tally.terminal_of.get(key) in skewed
            ),
            restored_away=len(restored_away),
            restore_lookups=dict(run.after_restore),
            kills=Counter(f.kind for f in run.faults if f.injected),
            outcomes=Counter(tally.outcomes.values()),
            client_counts=Counter(tally.counts),
            proxy=proxy_stats,
            probe=(len(run.probe.results), sum(1 for _, ok in run.probe.results if not ok)),
            probe_outcome=probe_outcome,
            drained=drained,
            advices=advices,
            acquirer_kills=run.acquirer.kills,
            checks=checks,
            errors=run.errors,
            started=run.started,
            phases=timeline.rows(),
            budget_s=timeline.total_s,
            command=" ".join(["python -m idempay_tools.chaos", *(argv or sys.argv[1:])]),
            settlement=settlement,
        )

    def _settle(self, run: Run) -> Settlement | None:
        """The acquirer's clearing file of each day of the run, written from its store now
        that the advice queue has drained, landed in the run's lake (the final export is
        in) and reconciled by the DuckDB reference (``_chaos_settlement``); None, with a
        harness error, when that itself failed."""
        say("chaos: the settlement reconciliation (the acquirer's clearing files)")
        try:
            return _bounded(
                check_settlement(
                    database_url=self.pg.url,
                    store=run.acquirer.store,
                    lake=self.root / "lake",
                    folder=self.root / "clearing",
                    run_days=run_days(run.exporter.started_at),
                    exempt_windows=report.wall_windows(run.restores_wall),
                ),
                self.timeline,
                "the settlement reconciliation",
            )
        except Overrun:
            raise
        except Exception as exc:  # named in the report; the run fails on it
            run.errors.append(f"the settlement reconciliation failed: {type(exc).__name__}: {exc}")
            return None

    def _stop_proxy(self) -> None:
        """The proxy's thread, stopped within 10 s (its connections are cancelled)."""
        if self.proxy is None:
            return
        proxy, self.proxy = self.proxy, None
        stopper = threading.Thread(target=proxy.stop, name="proxy-stop", daemon=True)
        stopper.start()
        stopper.join(10.0)

    def close(self) -> list[str]:
        """Stop everything the run started, in order, each step bounded (the SQLite
        disk-full episode too: its loop disk is unmounted); then stop by PID whatever is
        still registered (and the postmaster) and unmount whatever is still mounted in the
        run's folder. What the sweep found."""
        self.tracker.closing.set()  # nothing starts any more; terminals are not rebooted
        run = self.run
        steps: list[tuple[str, Any]] = []
        if run is not None:
            steps += [(f"terminal {t.terminal_id}", t.terminate) for t in run.terminals]
            steps += [("export loop", lambda: run.exporter.stop(timeout=5.0))]
            steps += [("probe", run.probe.stop)]
        if (disk_full := self.disk_full) is not None:  # its server stopped, disk unmounted
            steps += [("sqlite disk-full episode", lambda: disk_full.stop(timeout=20.0))]
        steps += [("chaos proxy", self._stop_proxy)]
        steps += [(f"server {s.label}", lambda s=s: s.stop(timeout=10.0)) for s in self.servers]
        if self.acquirer is not None:
            steps += [("acquirer host", self.acquirer.stop)]
        steps += [("redis", self.redis.kill), ("postgres", self.pg.stop_now)]
        for name, step in steps:
            try:
                step()
            except Exception as exc:  # keep cleaning up
                say(f"chaos: cleanup: {name}: {type(exc).__name__}: {exc}")
        if run is not None:
            for thread in run.threads:  # a fault mid-way fails fast now (closing)
                thread.join(10.0)
            for terminal in run.terminals:
                terminal.join(5.0)
        return sweep(self.root)


def _start_reaper(root: Path) -> subprocess.Popen[bytes]:
    """The watcher that cleans up if this process dies without doing it itself."""
    return subprocess.Popen(
        [sys.executable, "-m", "idempay_tools._chaos_reaper", str(os.getpid()), str(root)],
        cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.duration < 30:
        raise SystemExit("chaos: --duration must be at least 30 s")
    timeline = Timeline(args.duration, total_s=args.deadline or total_budget(args.duration))
    root = Path(tempfile.mkdtemp(prefix="idempay-chaos-"))
    stopping = False
    code = 1
    try:
        install_signal_handlers(lambda: stopping)
        reaper = _start_reaper(root)
        if args.keep:
            (root / KEEP).touch()
        say(
            f"chaos: seed {args.seed}, {args.duration:.0f} s, {args.terminals} terminals; "
            f"in {root}; pid {os.getpid()}; deadline {timeline.total_s:.0f} s"
        )
        harness = Harness(args, root, timeline)
        try:
            code = harness.execute(argv)
        except Overrun as exc:
            say(f"chaos: FAILED — {exc}")
            say("chaos: no report written (the run did not finish)")
        except Interrupted as exc:
            say(f"chaos: {exc}; stopping everything the run started")
            code = 128 + exc.signum
        except Exception:
            traceback.print_exc()
            say("chaos: FAILED — the harness itself failed (traceback above)")
        finally:
            stopping = True
            timeline.disarm()
            _cleanup(harness, root, keep=args.keep)
        reaper.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            reaper.wait(5)
    except Interrupted as exc:  # before the harness existed: nothing of ours runs yet
        say(f"chaos: {exc}")
        shutil.rmtree(root, ignore_errors=True)
        code = 128 + exc.signum
    return code


def _write_probe_log(run: Run, path: Path) -> None:
    """Every probe create and every fault, in seconds from the fleet's start (for a kept
    run's folder: which create was answered when, next to what was injected when)."""
    lines = ["what\tat_s\tkey_or_kind\tstatus\tanswered_after_s_or_detail"]
    for fault in run.faults:
        if fault.injected:
            at = fault.injected - run.started
            lines.append(f"fault\t{at:.3f}\t{fault.kind}\t\t{fault.detail}")
    for dumped, stopped in run.restores:
        lines.append(f"restore\t{dumped - run.started:.3f}\tdumped\t\t{stopped - run.started:.3f}")
    for c in run.probe.creates:
        after = "" if c.answered_at is None else f"{c.answered_at - c.at:.3f}"
        lines.append(f"probe\t{c.at - run.started:.3f}\t{c.key}\t{c.status or ''}\t{after}")
    with contextlib.suppress(OSError):
        path.write_text("\n".join(lines) + "\n")


def _cleanup(harness: Harness, root: Path, *, keep: bool) -> None:
    """``harness.close()`` and the folder removed, within ``CLEANUP_S``: past it, this
    process exits at once and the reaper (still watching) finishes the job."""
    began = time.monotonic()

    def overran() -> None:
        say(f"chaos: cleanup overran its {CLEANUP_S:.0f} s: exiting; the reaper finishes it")
        os._exit(124)

    watchdog = threading.Timer(CLEANUP_S, overran)
    watchdog.daemon = True
    watchdog.start()
    try:
        left = harness.close()
    finally:
        watchdog.cancel()
    if left:
        say(f"chaos: cleanup: stopped by PID: {', '.join(left)}")
    if keep:
        (root / CLEAN).touch()
        say(f"chaos: kept {root}")
    else:
        shutil.rmtree(root, ignore_errors=True)
    say(f"chaos: cleanup took {time.monotonic() - began:.1f} s")


KEPT_FROM = "\n## Failover"  # written by make failover (idempay_tools/failover.py), not here


def _kept_sections(report: Path) -> str:
    """What other harnesses appended to the same document (the failover figures): kept
    when the chaos run rewrites its own part."""
    old = report.read_text() if report.exists() else ""
    at = old.find(KEPT_FROM)
    return old[at:] if at >= 0 else ""


if __name__ == "__main__":
    sys.exit(main())
