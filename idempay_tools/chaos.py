"""``make chaos``: a terminal fleet through the chaos proxy while faults land on a seeded
schedule; then contract §8's invariants and the ledger balance per merchant.

    python -m idempay_tools.chaos [--duration 300] [--seed 7] [--terminals 12]
                             [--report docs/reliability.md] [--keep]

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
deadline). Each lands in its own slot of the run; a 5-minute run holds every kind at
least once (worker and terminal kills three times), a short run (the ``make test``
variant) each kind once.

After the run the terminals stop selling and settle their journals, the completer and the
relay drain, the API stops (flushing its request events), a final export runs, and the
checks run: contract §8 on the database and the journals (``idempay_tools.invariants``),
every outbox event relayed, nothing stuck processing, no 500 answered, no terminal process
died on its own, no payment refused for a skewed clock, no raw storage error after a send,
no stale answer after the restore, every victim of the flood approved in time, and the lake
(``idempay_tools._chaos_lake``): every request event in the database in the lake exactly
once. Time to recover (per fault): from the injection until the component was back *and*
work went through again (``_chaos_report._RECOVERED_BY``).

Exit status 0 only when every check holds. ``--report PATH`` writes the run as Markdown
(``docs/reliability.md`` under ``make chaos``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from idempay_tools import _chaos_report as report
from idempay_tools._chaos_fleet import Probe, Tally, TerminalProcess
from idempay_tools._chaos_lake import check_lake
from idempay_tools._chaos_phases import Exporter, NoisyNeighbour
from idempay_tools._chaos_services import (
    ROOT,
    Api,
    PrivatePostgres,
    PrivateRedis,
    Sidecar,
    migrate_and_keys,
)
from idempay_tools.chaos_proxy import ChaosProxy, ProxyThread
from idempay_tools.serve_process import say

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
}
RECOVER_TIMEOUT_S = 90.0
JOURNAL_FULL_BYTES = 4096  # RLIMIT_FSIZE: every journal write past the first page fails
RESTORE_FLUSH_MARGIN_S = 1.0  # events answered just before a dump, flushed after it
SIGKILL_EVENT_LOSS_S = 5.0  # a SIGKILLed worker's unflushed events: creates this long before


def event_loss_windows(
    faults: list[Fault], restores: list[tuple[float, float]]
) -> list[tuple[float, float]]:
    """When an answered create's request event may be lost, as documented (docs/analytics.md):
    a SIGKILLed worker's unflushed events — those of the last ``SIGKILL_EVENT_LOSS_S``, or
    since the start of a storage outage the kill followed closely (the writer holds events
    while it cannot flush) — and whatever a restore takes back, from a flush interval's
    margin before the dump to the API's stop."""
    outages = [
        (f.injected, f.recovered or f.healed or f.injected)
        for f in faults
        if f.kind in ("postgres_restart", "db_restore") and f.injected
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


@dataclass
class Fault:
    kind: str
    at_s: float  # planned, from the start of the fleet
    hold_s: float  # how long the component stays down / the burst lasts
    injected: float = 0.0  # monotonic
    healed: float | None = None
    recovered: float | None = None
    probe_failures: int = 0
    detail: str = ""

    @property
    def recover_s(self) -> float | None:
        return None if self.recovered is None else self.recovered - self.injected


def plan(duration_s: float, seed: int) -> list[Fault]:
    """The fault schedule: each fault in its own slot after a warm-up, order and offsets
    drawn from ``seed``. At least 5 minutes: ``LONG_COUNTS``; shorter: each kind once."""
    rng = random.Random(f"{seed}:plan")
    counts = LONG_COUNTS if duration_s >= 300 else dict.fromkeys(KINDS, 1)
    kinds = [kind for kind, n in counts.items() for _ in range(n)]
    rng.shuffle(kinds)
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
    }
    return [
        Fault(kind, warmup + i * slot + rng.uniform(0.0, slot * 0.2), holds[kind])
        for i, kind in enumerate(kinds)
    ]


@dataclass
class Run:
    """Everything one chaos run starts, and what it saw."""

    args: argparse.Namespace
    root: Path
    pg: PrivatePostgres
    redis: PrivateRedis
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
    started: float = 0.0
    fleet_s: float = 0.0
    errors: list[str] = field(default_factory=list)
    restores: list[tuple[float, float]] = field(default_factory=list)  # (dump, API stopped)
    after_restore: dict[str, int] = field(default_factory=dict)  # key → lookup status

    # ------------------------------------------------------------------ the faults
    def inject(self, fault: Fault) -> None:
        fault.injected = time.monotonic()
        getattr(self, f"_{fault.kind}")(fault)
        if fault.recovered is None and fault.healed is not None:
            deadline = fault.healed + RECOVER_TIMEOUT_S
            while fault.recovered is None and time.monotonic() < deadline:
                fault.recovered = self.probe.first_success_after(fault.healed)
                time.sleep(0.05)
        end = fault.recovered or time.monotonic()
        fault.probe_failures = self.probe.failures_between(fault.injected, end)

    def _worker_kill(self, fault: Fault) -> None:
        pid = self.api.kill_worker(self.rng)
        fault.detail = f"SIGKILL uvicorn worker pid {pid}"
        if self.api.wait_workers(without=pid, timeout=RECOVER_TIMEOUT_S):
            fault.healed = time.monotonic()

    def _terminal_kill(self, fault: Fault) -> None:
        victim = self.rng.choice(self.terminals)
        fault.detail = f"SIGKILL {victim.terminal_id}, rebooted on its journal"
        killed = victim.kill()
        deadline = killed + RECOVER_TIMEOUT_S
        while time.monotonic() < deadline:
            if victim.booted_at > killed:
                fault.healed = fault.recovered = victim.booted_at
                return
            time.sleep(0.05)

    def _postgres_restart(self, fault: Fault) -> None:
        fault.detail = f"pg_ctl stop -m immediate; down {fault.hold_s:.0f} s; start"
        self.pg.crash()
        time.sleep(fault.hold_s)
        self.pg.start()
        fault.healed = time.monotonic()

    def _redis_restart(self, fault: Fault) -> None:
        fault.detail = f"SIGKILL redis-server; down {fault.hold_s:.0f} s; start empty"
        self.redis.kill()
        time.sleep(fault.hold_s)
        self.redis.start()
        fault.healed = time.monotonic()

    def _journal_full(self, fault: Fault) -> None:
        """The terminal's disk fills and frees again (1 s full, 0.3 s free) for ``hold_s``:
        the limit lands at random moments of its payments, some of them in flight."""
        victim = self.rng.choice(self.terminals)
        pids: set[int] = set()
        flips = 0
        until = time.monotonic() + fault.hold_s
        while time.monotonic() < until:
            if (pid := victim.limit_journal(JOURNAL_FULL_BYTES)) is not None:
                pids.add(pid)
            time.sleep(self.rng.uniform(0.5, 1.0))
            victim.limit_journal(None)
            flips += 1
            time.sleep(self.rng.uniform(0.1, 0.3))
        fault.detail = (
            f"{victim.terminal_id} (pid {', '.join(str(p) for p in sorted(pids))}): "
            f"RLIMIT_FSIZE {JOURNAL_FULL_BYTES} B {flips} times over {fault.hold_s:.0f} s "
            "(every journal write fails while it holds)"
        )
        fault.healed = time.monotonic()
        deadline = fault.healed + RECOVER_TIMEOUT_S
        while time.monotonic() < deadline:
            if (settled := victim.settled_since(fault.healed)) is not None:
                fault.recovered = settled
                return
            time.sleep(0.05)

    def _db_restore(self, fault: Fault) -> None:
        """pg_dump; sell for ``hold_s``; stop the API, completer and relay; restore the dump;
        ``idempay admin new-epoch``; start them again. Redis keeps everything it cached."""
        dumped = time.monotonic()
        dump = self.pg.dump(f"restore-{len(self.restores)}")
        time.sleep(fault.hold_s)
        for process in (self.api, *self.sidecars):
            process.stop()
        stopped = time.monotonic()
        self.restores.append((dumped, stopped))
        self.pg.restore(dump)
        epoch = subprocess.run(
            [sys.executable, "-m", "api", "admin", "new-epoch"], cwd=ROOT,
            env={**os.environ, **self.env}, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        said = (epoch.stdout + epoch.stderr).strip().splitlines()
        if epoch.returncode != 0:
            self.errors.append(f"idempay admin new-epoch failed: {' '.join(said)[-300:]}")
        fault.detail = (
            f"pg_dump, {fault.hold_s:.0f} s of selling, API stopped, pg_restore, "
            f"`idempay admin new-epoch` ({'ok' if epoch.returncode == 0 else 'FAILED'}), "
            "API started; Redis kept"
        )
        self.api.start()
        self._look_up_restored(dumped, stopped)
        for sidecar in self.sidecars:
            sidecar.launch()
        fault.healed = time.monotonic()

    def _look_up_restored(self, dumped: float, stopped: float, most: int = 100) -> None:
        """Before anything else runs on the restored database: look up the payments that
        were processed between the dump and the stop. The database has none of those
        committed after the dump; an answer 200 for one of them came from Redis (contract §3.6)."""
        api_keys = {t.terminal_id: t.config.api_key for t in self.terminals}
        processed = [
            key
            for key, at in list(self.tally.when.items())
            if dumped <= at <= stopped and self.tally.outcomes.get(key) in ("approved", "declined")
        ]
        with httpx.Client(base_url=self.api.url, timeout=5.0) as http:
            for key in processed[:most]:
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
            if not self.api.wait_workers(without=pid, timeout=RECOVER_TIMEOUT_S):
                return
        fault.healed = time.monotonic()

    def _noisy_neighbour(self, fault: Fault) -> None:
        noisy = self.noisy
        fault.detail = (
            f"{NOISY}: {noisy.connections} connections of tok_issuer_down creates for "
            f"{fault.hold_s:.0f} s; {noisy.victims} tok_issuer_timeout payments of another "
            "merchant meanwhile"
        )
        fault.healed = noisy.run(fault.hold_s)
        finished = [v.finished for v in noisy.results]
        if noisy.results and all(f is not None for f in finished):
            fault.recovered = max(f for f in finished if f is not None)
        fault.detail += f"; flood answers {dict(sorted(noisy.flood_sent.items()))}"

    def _loss_burst(self, fault: Fault) -> None:
        fault.detail = f"link loss {STEADY_LOSS:.1%} → {BURST_LOSS:.0%} for {fault.hold_s:.0f} s"
        self.proxy.proxy.loss = BURST_LOSS
        time.sleep(fault.hold_s)
        self.proxy.proxy.loss = STEADY_LOSS
        fault.healed = time.monotonic()
        deadline = fault.healed + RECOVER_TIMEOUT_S
        while time.monotonic() < deadline:
            after = [t for t in list(self.tally.completed) if t >= fault.healed]
            if after:
                fault.recovered = min(after)
                return
            time.sleep(0.05)

    # ------------------------------------------------------------------ the run
    def fleet(self) -> None:
        """Start the fleet, inject the faults on schedule, then stop the terminals."""
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        for terminal in self.terminals:
            terminal.start()
        self.probe.start()
        self.exporter.start()
        self.started = time.monotonic()
        schedule = threading.Thread(target=self._schedule, name="faults", daemon=True)
        schedule.start()
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
        schedule.join()  # a fault still recovering finishes first
        self.fleet_s = time.monotonic() - self.started
        (self.root / "stop").touch()
        for terminal in self.terminals:
            if not terminal.join(240):
                terminal.terminate()
                self.errors.append(f"{terminal.terminal_id} did not settle its journal in time")
        self.probe.stop()
        self.exporter.stop()

    def _schedule(self) -> None:
        for fault in self.faults:
            wait = self.started + fault.at_s - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            try:
                self.inject(fault)
            except Exception as exc:  # reported, and the run fails
                self.errors.append(f"{fault.kind}: {type(exc).__name__}: {exc}")
                fault.detail = f"{fault.detail} — FAILED: {exc}"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m idempay_tools.chaos", description=__doc__)
    parser.add_argument("--duration", type=float, default=300.0, help="fleet seconds")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--terminals", type=int, default=12)
    parser.add_argument("--workers", type=int, default=2, help="API worker processes")
    parser.add_argument("--report", type=Path, help="write the run as Markdown here")
    parser.add_argument("--keep", action="store_true", help="keep the run's folder")
    return parser


def _env(pg: PrivatePostgres, redis: PrivateRedis, root: Path) -> dict[str, str]:
    return {
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


def main(argv: list[str] | None = None) -> int:
    from idempay_tools.simulate import FleetConfig

    args = _parser().parse_args(argv)
    if args.duration < 30:
        raise SystemExit("chaos: --duration must be at least 30 s")
    root = Path(tempfile.mkdtemp(prefix="idempay-chaos-"))
    say(f"chaos: seed {args.seed}, {args.duration:.0f} s, {args.terminals} terminals; in {root}")
    pg = PrivatePostgres(root).init()
    redis = PrivateRedis(root)
    started: list[object] = []
    try:
        pg.start()
        redis.start()
        keys = migrate_and_keys(pg.url, [*MERCHANTS, PROBE, NOISY])
        env = _env(pg, redis, root)
        (root / "logs").mkdir()
        api = Api(env, root / "logs" / "api.log", workers=args.workers, cwd=ROOT)
        api.start()
        started.append(api)
        sidecars = [
            Sidecar([name], env, root / "logs" / f"{name}.log") for name in ("completer", "relay")
        ]
        for sidecar in sidecars:
            sidecar.launch()
            started.append(sidecar)
        proxy = ChaosProxy(
            target_host="127.0.0.1",
            target_port=api.port,
            seed=args.seed,
            loss=STEADY_LOSS,
            drop_request_ratio=0.5,
            reset_ratio=0.2,
        ).run_in_thread()
        started.append(proxy)
        tally = Tally()
        terminals = []
        for index in range(args.terminals):
            merchant = MERCHANTS[index % len(MERCHANTS)]
            config = FleetConfig(
                base_url=f"http://127.0.0.1:{proxy.port}",
                api_key=keys[merchant][1],
                workdir=root / "journals",
                via_proxy=True,
                seed=args.seed,
                deadline_s=30.0,
                timeout_s=5.0,
                max_backoff=1.0,
                abort_grace_s=15.0,
                terminal_prefix="CHAOS",
                clock_skew_s=SKEWS[index] if index < len(SKEWS) else 0.0,
            )
            config.workdir.mkdir(parents=True, exist_ok=True)
            terminals.append(TerminalProcess(config, index, root / "stop", tally))
        run = Run(
            args=args,
            root=root,
            pg=pg,
            redis=redis,
            api=api,
            sidecars=sidecars,
            proxy=proxy,
            terminals=terminals,
            probe=Probe(api.url, keys[PROBE][1]),
            tally=tally,
            faults=plan(args.duration, args.seed),
            rng=random.Random(f"{args.seed}:victims"),
            env=env,
            exporter=Exporter(env, root / "lake", root / "logs" / "export.log"),
            noisy=NoisyNeighbour(
                api.url, keys[NOISY][1], keys[MERCHANTS[1]][1], deadline_s=ISSUER_DEADLINE_S
            ),
        )
        run.fleet()
        proxy_stats = dict(proxy.stats)
        proxy.stop()
        started.remove(proxy)
        say("chaos: fleet stopped; settling probe keys, completer and relay")
        probe_outcome = run.probe.settle()
        ids = [keys[name][0] for name in MERCHANTS]
        others = [keys[PROBE][0], keys[NOISY][0]]
        drained = asyncio.run(report.drain(pg.url, [*ids, *others]))
        for sidecar in sidecars:
            if not sidecar.alive():
                run.errors.append(f"{sidecar.args[0]} exited on its own")
        if not api.alive():
            run.errors.append("the API supervisor exited on its own")
        for process in (api, *sidecars):
            process.stop()
            started.remove(process)
        for terminal in terminals:
            run.errors.extend(terminal.unexpected_exits)
        say("chaos: the final export")
        if not run.exporter.export():
            run.errors.append("the final export failed (logs/export.log)")
        reported = dict(tally.outcomes)
        reported.update({v.key: v.status for v in run.noisy.results if v.status != "unsettled"})
        restored_away = {
            key for key, at in tally.when.items() if any(a <= at <= b for a, b in run.restores)
        }
        checks = asyncio.run(
            report.check(
                pg.url,
                merchants=ids,
                probe=keys[PROBE][0],
                noisy=keys[NOISY][0],
                reported=reported,
                restored_away=restored_away,
                journals=[t.journal for t in terminals],
                ask=[key for _, key, kind in tally.journal_failures if key],
                held_after_restore=[k for k, code in run.after_restore.items() if code == 200],
            )
        )
        lake = asyncio.run(
            check_lake(
                pg.url,
                root / "lake",
                probe_merchant=keys[PROBE][0],
                probe_creates=run.probe.creates,
                exempt_windows=event_loss_windows(run.faults, run.restores),
            )
        )
        skewed = {t.terminal_id: t.config.clock_skew_s for t in terminals if t.config.clock_skew_s}
        result = report.Result(
            seed=args.seed,
            duration_s=args.duration,
            fleet_s=run.fleet_s,
            terminals=args.terminals,
            workers=args.workers,
            faults=run.faults,
            skewed=skewed,
            lake=lake,
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
            checks=checks,
            errors=run.errors,
            started=run.started,
            command=" ".join(["python -m idempay_tools.chaos", *(argv or sys.argv[1:])]),
        )
        report.show(result)
        if args.report:
            args.report.write_text(report.markdown(result) + _kept_sections(args.report))
            say(f"chaos: report written to {args.report}")
        say("chaos: " + ("PASSED" if result.ok else "FAILED"))
        return 0 if result.ok else 1
    finally:
        for thing in reversed(started):
            stop = getattr(thing, "stop", None)
            if stop is not None:
                try:
                    stop()
                except Exception as exc:  # keep cleaning up
                    say(f"chaos: cleanup: {type(exc).__name__}: {exc}")
        redis.kill()
        pg.stop()
        if args.keep:
            say(f"chaos: kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


KEPT_FROM = "\n## Failover"  # written by make failover (idempay_tools/failover.py), not here


def _kept_sections(report: Path) -> str:
    """What other harnesses appended to the same document (the failover figures): kept
    when the chaos run rewrites its own part."""
    old = report.read_text() if report.exists() else ""
    at = old.find(KEPT_FROM)
    return old[at:] if at >= 0 else ""


if __name__ == "__main__":
    sys.exit(main())
