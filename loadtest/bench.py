"""``make bench``: idempay's create beside its own bypassed baseline, in one run.

    python -m loadtest.bench [--rounds 5] [--seconds 5] [--concurrency 50]
                             [--acquirer-latency-ms 0] [--acquirer-jitter-ms 0] [--matrix]
                             [--json out.json] [--profile] [--quick] [--no-peers]

One private Postgres database (dropped at the end, even on failure), one simulated acquirer
host in its own process (``api.acquirer.host.process.AcquirerProcess``: ISO 8583 over TCP,
its own SQLite store), one server (``python -m loadtest._bench_app --workers 1``: the
server's app plus the bypass route, which the server itself never mounts) pointed at that
host by ``IDEMPAY_ACQUIRER_URL``, and a closed-loop aiohttp generator in its own process on
the same machine. Every create — idempay's, the baseline's and the peers' — is one 0200 to
that one host through the same link library (``api.acquirer.link``). Scenarios — create
(claim, 0200, finish), bypassed (``POST /_bench/transactions``: the same 0200 and inserts
minus the idempotency layer), replay of
pre-created keys, lookup of existing keys, and pgbench running the create's SQL when it is
installed — are measured in alternating rounds (forward, then reversed order, so slow drift
on a shared machine hits every scenario alike). Only ratios taken side by side in one run
mean anything here; absolute figures move with the machine's other load. Before each round
the bench runs ``ANALYZE`` on its database — what autovacuum does on a stock Postgres, which
this machine's shared server runs without (``_bench_env.analyze``; docs/benchmarks.md,
"Postgres without autovacuum").

The comparison servers run in the same rounds with the same client
(``loadtest/_bench_peers.py``): ``plain`` (FastAPI, pydantic body + one Redis INCR + one 0200
through the link library), ``idemkit`` (the same app behind idemkit's Idempotency-Key
middleware on Redis) — both on a private Redis database (``--peers-redis``) —
``create-sqlite`` (idempay's create on the embedded SQLite default) and ``create-2w``
(idempay's create on Postgres served by two workers with half the pool each). The
create-path goals are printed met/missed on paired ratios (``_bench_goals``).

The acquirer setting (``--acquirer-latency-ms`` plus a uniform 0..``--acquirer-jitter-ms``)
and ``--concurrency`` make one cell, by default no added latency at 50 in flight.
``--matrix`` runs four cells one after the other on the same servers and host (its faults
switched through the control socket): no added latency and 50 ms ± 5 ms (45 + 0..10), each at
50 and 200 in flight — every scenario in each cell, except pgbench and the idempay+Redis
pair, which never reach the acquirer and run in the first cell only.
``--quick`` (~1 minute a cell): 3 rounds × 2.5 s, a 500-key pool, no pgbench, no
idempay+Redis.

Exit status 1 when any scenario has more than 0.5 % errors (any unexpected status).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import statistics
import sys
import tempfile
import time
import uuid
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console

from api.acquirer.host.process import AcquirerProcess
from loadtest import _bench_goals as peer_goals
from loadtest import _bench_peers as peers
from loadtest import _bench_pgbench as pgbench
from loadtest import _bench_profile as profiling
from loadtest import _gc_trace
from loadtest._bench_driver import SCENARIOS, Load, run_load
from loadtest._bench_env import (
    PG_ADMIN,
    Server,
    analyze,
    cpu_delta,
    create_database,
    drop_database,
    free_connection_slots,
    group_commits,
    machine_info,
    postgres_settings,
    prepare_database,
    sample_cpu,
)
from loadtest._bench_layers import LAYERS
from loadtest._bench_report import (
    ERROR_BUDGET_PCT,
    percentile,
    ratios,
    render,
    render_profile,
    summarize,
)
from loadtest._bench_waits import WaitSampler

REDIS_SCENARIOS = ("replay+redis", "lookup+redis")
PEER_SCENARIOS = ("plain", "idemkit", "create-sqlite", "create-2w")
# The second-worker server (goal 5) gets half the pool per worker: the same connection budget.
DEFAULT_DB_POOL = 30
ALL_SCENARIOS = (*SCENARIOS, *REDIS_SCENARIOS, *PEER_SCENARIOS)
# --matrix: (added acquirer latency ms, jitter ms) × concurrency; 45 + 0..10 is 50 ± 5 ms
MATRIX_SETTINGS = ((0.0, 0.0), (45.0, 10.0))
MATRIX_CONCURRENCY = (50, 200)


@dataclass(frozen=True, slots=True)
class Cell:
    """One acquirer setting at one concurrency: the unit the goals are judged in."""

    latency_ms: float
    jitter_ms: float
    concurrency: int

    @property
    def name(self) -> str:
        if self.latency_ms or self.jitter_ms:
            mid, half = self.latency_ms + self.jitter_ms / 2, self.jitter_ms / 2
            acquirer = f"acquirer {mid:g} ± {half:g} ms"
        else:
            acquirer = "acquirer +0 ms"
        return f"{acquirer}, c={self.concurrency}"


def cells_for(args: argparse.Namespace) -> list[Cell]:
    if args.matrix:
        return [
            Cell(latency, jitter, concurrency)
            for latency, jitter in MATRIX_SETTINGS
            for concurrency in MATRIX_CONCURRENCY
        ]
    return [Cell(args.acquirer_latency_ms, args.acquirer_jitter_ms, args.concurrency)]


def _clean_redis(url: str, prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    try:
        names = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if names:
            client.delete(*names)
    finally:
        client.close()


SEED_ATTEMPTS = 5
START_TIMEOUT_S = 180.0  # a server's start on a loaded shared machine
PG_HEADROOM = 10  # connections left to everything else on this machine's shared Postgres
MIN_PGBENCH_CLIENTS = 5


def _start(name: str, server: Server | peers.PeerServer) -> None:
    """Start one server, allowing a loaded machine its time; the error names the server."""
    try:
        server.start(timeout=START_TIMEOUT_S)
    except RuntimeError as exc:
        raise RuntimeError(f"the {name} server did not start ({server.log_path}): {exc}") from None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.bench", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds per scenario per round")
    parser.add_argument("--concurrency", type=int, default=50, help="closed-loop workers (50)")
    parser.add_argument(
        "--acquirer-latency-ms",
        type=float,
        default=0.0,
        help="the acquirer host's added answer latency (0)",
    )
    parser.add_argument(
        "--acquirer-jitter-ms", type=float, default=0.0, help="plus a uniform 0..jitter (0)"
    )
    parser.add_argument(
        "--matrix",
        action="store_true",
        help="four cells: acquirer +0 ms and 50 ± 5 ms, each at concurrency 50 and 200"
        " (overrides --concurrency and the acquirer latency)",
    )
    parser.add_argument("--pool", type=int, default=2000, help="pre-created keys for replay/lookup")
    parser.add_argument("--warmup", type=float, default=1.0, help="discarded seconds per scenario")
    parser.add_argument("--json", type=Path, help="write every figure to this file")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="py-spy the server during creates: frames, packages, layers, GC pauses",
    )
    parser.add_argument("--profile-seconds", type=int, default=10, help="py-spy duration (10)")
    parser.add_argument("--profile-raw", type=Path, help="keep py-spy's collapsed stacks here")
    parser.add_argument("--no-pgbench", action="store_true", help="skip the pgbench ceiling")
    parser.add_argument(
        "--redis",
        default="redis://127.0.0.1:6379/0",
        help="Redis for the replay/lookup-with-Redis scenarios ('' to skip them)",
    )
    parser.add_argument("--pgbench-clients", type=int, default=50, help="pgbench -c (50)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="~1 minute: 3 rounds × 2.5 s, 500 keys, no pgbench, no idempay+Redis scenarios",
    )
    parser.add_argument("--no-peers", action="store_true", help="skip plain/idemkit/SQLite")
    parser.add_argument(
        "--peers-redis",
        default="redis://127.0.0.1:6379/11",
        help="Redis for the plain and idemkit peers (a private database number)",
    )
    parser.add_argument(
        "--pgbench-no-outbox",
        action="store_true",
        help="add a pgbench variant without the outbox statements to the rotation",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.seconds, args.pool, args.warmup = 3, 2.5, 500, 0.5
        args.no_pgbench, args.redis = True, ""
    return args


class Bench:
    def __init__(self, args: argparse.Namespace, console: Console, workdir: Path) -> None:
        self.args = args
        self.console = console
        self.workdir = workdir
        self.pgbench = None if args.no_pgbench else pgbench.find()
        self.rounds: list[dict[str, Any]] = []
        self.cells = cells_for(args)
        self.cell = self.cells[0]
        self.latencies: dict[tuple[str, str], list[float]] = {}  # (cell, scenario) → ms
        self.acquirer: AcquirerProcess | None = None
        self.profile: profiling.Profile | None = None
        self.profile_note = ""
        self.gc_path = workdir / "create.gc.json"
        self.pgbench_note = "" if self.pgbench else "pgbench not installed"
        self.scripts: dict[str, Path] = {}
        self.server: Server | None = None
        self.cached: Server | None = None  # the same app with the Redis fast path
        self.redis_prefix = f"idempay-bench-{os.getpid()}:"
        self.waits: WaitSampler | None = None
        self.peers: dict[str, Server | peers.PeerServer] = {}  # scenario → its server
        self.peer_prefix = f"idempay-bench-peer-{os.getpid()}:"
        self.sqlite_key = ""

    def run(self, database: str) -> None:
        self.api_key = prepare_database(database)
        self.database = database
        first = self.cells[0]
        self.acquirer = AcquirerProcess(
            store=self.workdir / "acquirer" / "acquirer.sqlite3",
            log_path=self.workdir / "acquirer.log",
            args=("--latency-ms", f"{first.latency_ms:g}", "--jitter-ms", f"{first.jitter_ms:g}"),
        ).start()
        self.server = Server(
            database,
            self.workdir / "server.log",
            acquirer_url=self.acquirer.url,
            env={_gc_trace.ENV: str(self.gc_path)} if self.args.profile else None,
        )
        _start("create", self.server)
        if self.args.redis:
            self.cached = Server(
                database,
                self.workdir / "server-redis.log",
                redis_url=self.args.redis,
                redis_prefix=self.redis_prefix,
                acquirer_url=self.acquirer.url,
            )
            _start("idempay+Redis", self.cached)
        if not self.args.no_peers:
            self._start_peers()
        self.waits = WaitSampler(PG_ADMIN, database)
        self.waits.start()
        self.scripts = {name: pgbench.write_script(self.workdir, name) for name in self.pgbenches}
        spawn = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as executor:
            self.executor = executor
            for index, cell in enumerate(self.cells):
                self._enter(cell)
                if index == 0:
                    self._seed()
                self._warm_up()
                for number in range(self.args.rounds):
                    analyze(database)  # autovacuum's part, outside the timed rounds
                    order = self.order if number % 2 == 0 else self.order[::-1]
                    for scenario in order:
                        self._measure(scenario, number)
                if index == 0 and self.args.profile:
                    self._profile()

    def _enter(self, cell: Cell) -> None:
        """Switch the acquirer host's answer latency (its control socket) and the client's
        concurrency to ``cell``'s."""
        assert self.acquirer is not None
        self.cell = cell
        self.acquirer.control(latency_ms=cell.latency_ms, jitter_ms=cell.jitter_ms)
        if len(self.cells) > 1:
            self.console.print(f"[bold]{cell.name}[/]")

    def _start_peers(self) -> None:
        assert self.acquirer is not None
        for scenario, factory in (("plain", "plain_app"), ("idemkit", "idemkit_app")):
            self.peers[scenario] = peers.PeerServer(
                factory,
                self.workdir / f"{scenario}.log",
                redis_url=self.args.peers_redis,
                prefix=self.peer_prefix,
                acquirer_url=self.acquirer.url,
            )
        path = self.workdir / "sqlite" / "idempay.db"
        path.parent.mkdir()
        self.sqlite_key = peers.prepare_sqlite(path)
        self.peers["create-sqlite"] = Server(
            self.database,
            self.workdir / "server-sqlite.log",
            env={"IDEMPAY_DATABASE_URL": peers.sqlite_url(path)},
            acquirer_url=self.acquirer.url,
        )
        self.peers["create-2w"] = Server(  # idempay's create, Postgres, two workers
            self.database,
            self.workdir / "server-2w.log",
            workers=2,
            env={"IDEMPAY_DB_POOL_SIZE": str(DEFAULT_DB_POOL // 2)},
            acquirer_url=self.acquirer.url,
        )
        for name, server in self.peers.items():
            _start(name, server)

    def close(self) -> None:
        """Stop the sampler and the server (its whole process group); safe to call twice."""
        if self.waits is not None:
            self.waits.stop()
        for server in self.peers.values():
            server.stop()
        if self.peers:
            peers.clean_redis(self.args.peers_redis, self.peer_prefix)
        if self.server is not None:
            self.server.stop()
        if self.cached is not None:
            self.cached.stop()
            _clean_redis(self.args.redis, self.redis_prefix)
        if self.acquirer is not None:  # after every server: none of them is left waiting
            self.acquirer.stop()

    def load(self, scenario: str, seconds: float, pool: tuple[str, ...] = ()) -> Load:
        assert self.server is not None
        server = self.server
        if scenario in self.peers:  # the same create requests against a comparison server
            key = self.sqlite_key if scenario == "create-sqlite" else self.api_key
            return Load(self.peers[scenario].url, key, "create", seconds, self.cell.concurrency)
        if scenario.endswith("+redis"):  # the same requests against the Redis-backed server
            assert self.cached is not None
            server, scenario = self.cached, scenario.removesuffix("+redis")
        return Load(server.url, self.api_key, scenario, seconds, self.cell.concurrency, pool)

    @property
    def first_cell(self) -> bool:
        return self.cell == self.cells[0]

    @property
    def pgbenches(self) -> list[str]:
        if not self.pgbench or not self.first_cell:  # no acquirer in it: once is enough
            return []
        return ["pgbench", *(["pgbench-no-outbox"] if self.args.pgbench_no_outbox else [])]

    @property
    def order(self) -> list[str]:
        return [*self.http_scenarios, *self.pgbenches]

    @property
    def http_scenarios(self) -> list[str]:
        return [
            *SCENARIOS,
            *(REDIS_SCENARIOS if self.args.redis and self.first_cell else ()),
            *(PEER_SCENARIOS if not self.args.no_peers else ()),
        ]

    def _seed(self) -> None:
        self.pool = tuple(str(uuid.uuid4()) for _ in range(self.args.pool))
        for attempt in range(SEED_ATTEMPTS):
            # a key answered 202 (still at the acquirer) or 409 (held) is sent again with the
            # same body: its replay is the 201 once done — the idempotency contract at work
            seeded = self.executor.submit(run_load, self.load("seed", 600.0, self.pool)).result()
            if not seeded.errors and seeded.requests == len(self.pool):
                break
            self.console.print(f"[dim]seed pass {attempt + 1}: {seeded.statuses}, again[/]")
            time.sleep(2.0)
        else:
            raise RuntimeError(f"pre-creating the key pool failed: {seeded.statuses}")
        self.console.print(f"[dim]pre-created {len(self.pool):,} keys for replay and lookup[/]")

    def _warm_up(self) -> None:
        for scenario in self.http_scenarios:
            self.executor.submit(
                run_load, self.load(scenario, self.args.warmup, self.pool)
            ).result()
        for script in self.scripts.values():
            assert self.pgbench
            pgbench.run(self.pgbench, script, self.database, seconds=1, clients=10, threads=2)

    def wait_label(self, scenario: str) -> str:
        return self.wait_label_for(self.cell, scenario)

    def wait_label_for(self, cell: Cell, scenario: str) -> str:
        """The wait sampler's label: the scenario, within its cell when there are several."""
        return scenario if len(self.cells) == 1 else f"{cell.name} · {scenario}"

    def _measure(self, scenario: str, number: int) -> None:
        assert self.waits is not None
        self.waits.scenario = self.wait_label(scenario)
        try:
            row = self._measure_one(scenario)
        finally:
            self.waits.scenario = None
        self.rounds.append(
            {"cell": self.cell.name, "scenario": scenario, "round": number + 1, **row}
        )
        self.console.print(
            f"[dim]round {number + 1}/{self.args.rounds}  {scenario:<13} {row['rate']:>8,.0f}/s"
            f"  errors {row['errors']}[/]"
        )

    def _measure_one(self, scenario: str) -> dict[str, Any]:
        assert self.server is not None
        pid = self.cached.pid if scenario.endswith("+redis") and self.cached else self.server.pid
        if scenario in self.peers:
            pid = self.peers[scenario].pid
        acquirer = self.acquirer.pid if self.acquirer is not None else 0
        before = sample_cpu(pid, self.database, acquirer)
        server = self._idempay_server(scenario)
        commits = group_commits(server.url) if server is not None else None
        if scenario in self.scripts:
            row = self._pgbench_round(self.scripts[scenario])
        else:
            result = self.executor.submit(
                run_load, self.load(scenario, self.args.seconds, self.pool)
            ).result()
            self.latencies.setdefault((self.cell.name, scenario), []).extend(result.latencies_ms)
            ordered = sorted(result.latencies_ms)
            row = {
                "requests": result.requests,
                "errors": result.errors,
                "rate": result.requests / result.elapsed_s,
                "elapsed_s": result.elapsed_s,
                "generator_cpu_s": result.cpu_s,
                "statuses": result.statuses,
                "p99_ms": percentile(ordered, 99),  # this round's own, for paired p99 ratios
            }
        row["cpu"] = cpu_delta(before, sample_cpu(pid, self.database, acquirer))
        if scenario in self.scripts:
            row["generator_cpu_s"] = row["cpu"]["children_s"]
        if server is not None and commits is not None:
            after = group_commits(server.url)
            if after is not None:
                row["group_commit"] = {name: after[name] - commits[name] for name in after}
        return row

    def _idempay_server(self, scenario: str) -> Server | None:
        """The idempay server a create scenario writes through (its group-commit counters)."""
        if scenario == "create":
            return self.server
        peer = self.peers.get(scenario)
        return peer if isinstance(peer, Server) and scenario.startswith("create") else None

    def _pgbench_round(self, script: Path) -> dict[str, Any]:
        assert self.pgbench
        seconds = max(1, round(self.args.seconds))
        clients = min(self.args.pgbench_clients, free_connection_slots() - PG_HEADROOM)
        if clients < MIN_PGBENCH_CLIENTS:
            result = pgbench.PgbenchResult(ok=False, message="Postgres has no free connections")
        else:
            result = pgbench.run(
                self.pgbench,
                script,
                self.database,
                seconds=seconds,
                clients=clients,
                threads=2,
            )
        if not result.ok:
            self.console.print(f"[yellow]pgbench round skipped:[/] {result.message}")
            self.pgbench_note = result.message.splitlines()[-1] if result.message else "failed"
        return {
            "ok": result.ok,
            "clients": clients,
            "requests": result.transactions,
            "errors": result.failed,
            "rate": result.tps,
            "latency_avg_ms": result.latency_avg_ms,
        }

    def _profile(self) -> None:
        py_spy = profiling.find()
        if py_spy is None:
            self.profile_note = "py-spy not installed"
            return
        assert self.server is not None
        seconds = self.args.profile_seconds
        pid = self.server.pid
        future = self.executor.submit(run_load, self.load("create", seconds + 3.0))
        time.sleep(1.5)
        out = self.workdir / "create.pyspy.txt"
        os.kill(pid, signal.SIGUSR2)  # the GC trace starts afresh with py-spy's window
        before = sample_cpu(pid, self.database)
        spy = profiling.start(py_spy, pid, seconds, out)
        spy_output, _ = spy.communicate(timeout=seconds + 60)
        after = sample_cpu(pid, self.database)
        os.kill(pid, signal.SIGUSR1)  # ... and is written when it ends
        driven = future.result()
        if spy.returncode != 0 or not out.exists():
            self.profile_note = f"py-spy failed: {spy_output.strip()[-500:]}"
            return
        if self.args.profile_raw:
            self.args.profile_raw.write_text(out.read_text())
        self.profile = profiling.parse(out.read_text())
        rate = driven.requests / driven.elapsed_s if driven.elapsed_s else 0.0
        window = after.wall - before.wall
        if rate and window > 0:
            self.profile.cpu_us_per_create = 1e6 * (after.server - before.server) / (rate * window)
        self.profile.gc = profiling.read_gc_trace(self.gc_path)
        self.profile_note = f"{driven.requests:,} creates during the profile" + (
            "" if self.profile.gc else "; no GC summary from the server"
        )

    def cell_rounds(self, cell: Cell) -> list[dict[str, Any]]:
        return [r for r in self.rounds if r["cell"] == cell.name]

    def figures(self, cell: Cell) -> dict[str, dict[str, Any]]:
        out = {}
        names = {r["scenario"]: None for r in self.cell_rounds(cell)}
        for scenario in names:
            rounds = [
                r for r in self.cell_rounds(cell) if r["scenario"] == scenario and r.get("ok", True)
            ]
            if rounds:
                latencies = self.latencies.get((cell.name, scenario), [])
                out[scenario] = summarize(rounds, latencies)
                if scenario in self.scripts:
                    out[scenario]["latency_avg_ms"] = statistics.median(
                        r["latency_avg_ms"] for r in rounds
                    )
                    out[scenario]["clients"] = sorted({r["clients"] for r in rounds})
        return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the clean-up below
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)
    machine = machine_info()
    started = datetime.now(UTC)
    load_before = os.getloadavg()
    database = create_database()
    try:
        # read before the servers hold their pools: the shared Postgres may be full later
        postgres = postgres_settings(database)
        with tempfile.TemporaryDirectory(prefix="idempay-bench-") as tmp:
            bench = Bench(args, console, Path(tmp))
            try:
                bench.run(database)
            finally:
                bench.close()
    finally:
        drop_database(database)
    load_after = os.getloadavg()
    loads = {"before": list(load_before), "after": list(load_after)}
    results = []
    failed: list[str] = []
    for cell in bench.cells:
        result = _report(console, args, bench, cell, machine, postgres, started, loads)
        results.append(result)
        failed += [f"{name} ({cell.name})" for name in result["failed"]]
    if args.profile:
        if bench.profile is not None:
            render_profile(console, bench.profile)
        console.print(bench.profile_note)
    if args.json:
        _write_json(args, bench, machine, postgres, started, loads, results)
    if failed:
        console.print(f"[red]FAILED[/]: errors over {ERROR_BUDGET_PCT} % in {', '.join(failed)}")
        return 1
    return 0


def _report(
    console: Console,
    args: argparse.Namespace,
    bench: Bench,
    cell: Cell,
    machine: dict[str, Any],
    postgres: dict[str, str],
    started: datetime,
    loads: dict[str, list[float]],
) -> dict[str, Any]:
    """One cell's tables, ratios and goals; its figures for the JSON document."""
    figures = bench.figures(cell)
    derived = ratios(figures)
    load = " / ".join(f"{a:.1f}" for a in loads["before"])
    title = (
        f"{started:%Y-%m-%d %H:%M} UTC · git {machine['git']} · "
        f"{machine['nproc']} cores {machine['cpu_model']} · "
        f"Python {machine['python']} · Postgres {postgres['version']} · generator on the same "
        f"machine · load average at start {load} · {cell.name} · "
        f"{args.rounds} rounds × {args.seconds:g} s"
    )
    waits = (
        {name: bench.waits.summary(bench.wait_label_for(cell, name)) for name in figures}
        if bench.waits
        else {}
    )
    context = {"title": title, "pgbench_note": bench.pgbench_note, "waits": waits}
    render(console, figures, derived, context)
    versus = peer_goals.peer_ratios(bench.cell_rounds(cell))
    verdicts = peer_goals.judge(versus, latency_ms=cell.latency_ms, concurrency=cell.concurrency)
    if versus:
        peer_goals.render(console, versus, verdicts, cell.name)
    expected = [r["scenario"] for r in bench.cell_rounds(cell) if "ok" not in r]
    failed = [
        name
        for name in dict.fromkeys(expected)
        if name not in figures
        or figures[name]["error_pct"] > ERROR_BUDGET_PCT
        or not figures[name]["requests"]
    ]
    return {
        "cell": cell.name,
        "acquirer": {"latency_ms": cell.latency_ms, "jitter_ms": cell.jitter_ms},
        "concurrency": cell.concurrency,
        "figures": figures,
        "ratios": {**derived, "peers": versus, "goals": verdicts},
        "postgres_backends": waits,
        "failed": failed,
    }


def _write_json(
    args: argparse.Namespace,
    bench: Bench,
    machine: dict[str, Any],
    postgres: dict[str, str],
    started: datetime,
    loads: dict[str, list[float]],
    results: list[dict[str, Any]],
) -> None:
    """Every figure; ``figures``/``ratios`` are the first cell's, ``cells`` holds them all."""
    first = results[0]
    document: dict[str, Any] = {
        "command": " ".join(["python -m loadtest.bench", *sys.argv[1:]]),
        "started_at": started.isoformat(),
        "machine": {
            **machine,
            "generator": "same machine, separate process",
            "load_average": loads,
        },
        "postgres": postgres,
        "options": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "figures": first["figures"],
        "ratios": first["ratios"],
        "postgres_backends": first["postgres_backends"],
        "cells": results,
        "rounds": bench.rounds,
    }
    if bench.profile is not None:
        document["profile"] = {
            "samples": bench.profile.samples,
            "self": bench.profile.top(bench.profile.self_time, 30),
            "packages": bench.profile.top(bench.profile.packages, 30),
            "sqlalchemy": bench.profile.top(bench.profile.sqlalchemy, 10),
            "inclusive": bench.profile.top(bench.profile.inclusive, 60),
            "layers": bench.profile.top(bench.profile.layers, len(LAYERS)),
            "cpu_us_per_create": bench.profile.cpu_us_per_create,
            "gc": bench.profile.gc,
        }
    args.json.write_text(json.dumps(document, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
