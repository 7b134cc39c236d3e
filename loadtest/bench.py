"""``make bench``: idempay's create beside its own bypassed baseline, in one run.

    python -m loadtest.bench [--rounds 5] [--seconds 5] [--concurrency 50]
                             [--json out.json] [--profile] [--quick] [--no-peers]

One private Postgres database (dropped at the end, even on failure), one server
(``python -m loadtest._bench_app --workers 1``: the server's app plus the bypass route, which
the server itself never mounts), and a closed-loop
aiohttp generator in its own process on the same machine. Scenarios — create, bypassed
(``POST /_bench/transactions``: the same inserts minus the idempotency layer), replay of
pre-created keys, lookup of existing keys, and pgbench running the create's SQL when it is
installed — are measured in alternating rounds (forward, then reversed order, so slow drift
on a shared machine hits every scenario alike). Only ratios taken side by side in one run
mean anything here; absolute figures move with the machine's other load. Before each round
the bench runs ``ANALYZE`` on its database — what autovacuum does on a stock Postgres, which
this machine's shared server runs without (``_bench_env.analyze``; docs/benchmarks.md,
"Session 6").

Issue 13's comparison servers run in the same rounds with the same client
(``loadtest/_bench_peers.py``): ``plain`` (FastAPI, pydantic body + one Redis INCR),
``idemkit`` (the same app behind idemkit's Idempotency-Key middleware on Redis) — both on a
private Redis database (``--peers-redis``) — ``create-sqlite`` (idempay's create on the
embedded SQLite default) and ``create-2w`` (idempay's create on Postgres served by two
workers with half the pool each: what a second worker adds, goal 5). Goals 1–4 of the issue
are printed met/missed on paired ratios.
``--quick`` (~1 minute): 3 rounds × 2.5 s, a 500-key pool, no pgbench, no idempay+Redis.

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
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console

from loadtest import _bench_goals as peer_goals
from loadtest import _bench_peers as peers
from loadtest import _bench_pgbench as pgbench
from loadtest import _bench_profile as profiling
from loadtest._bench_driver import SCENARIOS, Load, run_load
from loadtest._bench_env import (
    PG_ADMIN,
    Server,
    analyze,
    cpu_delta,
    create_database,
    drop_database,
    free_connection_slots,
    machine_info,
    postgres_settings,
    prepare_database,
    sample_cpu,
)
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


def _clean_redis(url: str, prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    try:
        names = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if names:
            client.delete(*names)
    finally:
        client.close()


PG_HEADROOM = 10  # connections left to everything else on this machine's shared Postgres
MIN_PGBENCH_CLIENTS = 5


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.bench", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds per scenario per round")
    parser.add_argument("--concurrency", type=int, default=50, help="closed-loop workers (50)")
    parser.add_argument("--pool", type=int, default=2000, help="pre-created keys for replay/lookup")
    parser.add_argument("--warmup", type=float, default=1.0, help="discarded seconds per scenario")
    parser.add_argument("--json", type=Path, help="write every figure to this file")
    parser.add_argument("--profile", action="store_true", help="py-spy the server during creates")
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
        self.latencies: dict[str, list[float]] = {name: [] for name in ALL_SCENARIOS}
        self.profile: profiling.Profile | None = None
        self.profile_note = ""
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
        self.server = Server(database, self.workdir / "server.log")
        self.server.start()
        if self.args.redis:
            self.cached = Server(
                database,
                self.workdir / "server-redis.log",
                redis_url=self.args.redis,
                redis_prefix=self.redis_prefix,
            )
            self.cached.start()
        if not self.args.no_peers:
            self._start_peers()
        self.waits = WaitSampler(PG_ADMIN, database)
        self.waits.start()
        self.scripts = {name: pgbench.write_script(self.workdir, name) for name in self.pgbenches}
        spawn = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as executor:
            self.executor = executor
            self._seed()
            self._warm_up()
            for number in range(self.args.rounds):
                analyze(database)  # autovacuum's part, outside the timed rounds (_bench_env)
                order = self.order if number % 2 == 0 else self.order[::-1]
                for scenario in order:
                    self._measure(scenario, number)
            if self.args.profile:
                self._profile()

    def _start_peers(self) -> None:
        for scenario, factory in (("plain", "plain_app"), ("idemkit", "idemkit_app")):
            self.peers[scenario] = peers.PeerServer(
                factory,
                self.workdir / f"{scenario}.log",
                redis_url=self.args.peers_redis,
                prefix=self.peer_prefix,
            )
        path = self.workdir / "sqlite" / "idempay.db"
        path.parent.mkdir()
        self.sqlite_key = peers.prepare_sqlite(path)
        self.peers["create-sqlite"] = Server(
            self.database,
            self.workdir / "server-sqlite.log",
            env={"IDEMPAY_DATABASE_URL": peers.sqlite_url(path)},
        )
        self.peers["create-2w"] = Server(  # idempay's create, Postgres, two workers
            self.database,
            self.workdir / "server-2w.log",
            workers=2,
            env={"IDEMPAY_DB_POOL_SIZE": str(DEFAULT_DB_POOL // 2)},
        )
        for server in self.peers.values():
            server.start()

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

    def load(self, scenario: str, seconds: float, pool: tuple[str, ...] = ()) -> Load:
        assert self.server is not None
        server = self.server
        if scenario in self.peers:  # the same create requests against a comparison server
            key = self.sqlite_key if scenario == "create-sqlite" else self.api_key
            return Load(self.peers[scenario].url, key, "create", seconds, self.args.concurrency)
        if scenario.endswith("+redis"):  # the same requests against the Redis-backed server
            assert self.cached is not None
            server, scenario = self.cached, scenario.removesuffix("+redis")
        return Load(server.url, self.api_key, scenario, seconds, self.args.concurrency, pool)

    @property
    def pgbenches(self) -> list[str]:
        if not self.pgbench:
            return []
        return ["pgbench", *(["pgbench-no-outbox"] if self.args.pgbench_no_outbox else [])]

    @property
    def order(self) -> list[str]:
        return [*self.http_scenarios, *self.pgbenches]

    @property
    def http_scenarios(self) -> list[str]:
        return [
            *SCENARIOS,
            *(REDIS_SCENARIOS if self.args.redis else ()),
            *(PEER_SCENARIOS if not self.args.no_peers else ()),
        ]

    def _seed(self) -> None:
        self.pool = tuple(str(uuid.uuid4()) for _ in range(self.args.pool))
        seeded = self.executor.submit(run_load, self.load("seed", 600.0, self.pool)).result()
        if seeded.errors or seeded.requests != len(self.pool):
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

    def _measure(self, scenario: str, number: int) -> None:
        assert self.waits is not None
        self.waits.scenario = scenario
        try:
            row = self._measure_one(scenario)
        finally:
            self.waits.scenario = None
        self.rounds.append({"scenario": scenario, "round": number + 1, **row})
        self.console.print(
            f"[dim]round {number + 1}/{self.args.rounds}  {scenario:<9} {row['rate']:>8,.0f}/s"
            f"  errors {row['errors']}[/]"
        )

    def _measure_one(self, scenario: str) -> dict[str, Any]:
        assert self.server is not None
        pid = self.cached.pid if scenario.endswith("+redis") and self.cached else self.server.pid
        if scenario in self.peers:
            pid = self.peers[scenario].pid
        before = sample_cpu(pid, self.database)
        if scenario in self.scripts:
            row = self._pgbench_round(self.scripts[scenario])
        else:
            result = self.executor.submit(
                run_load, self.load(scenario, self.args.seconds, self.pool)
            ).result()
            self.latencies[scenario].extend(result.latencies_ms)
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
        row["cpu"] = cpu_delta(before, sample_cpu(pid, self.database))
        if scenario in self.scripts:
            row["generator_cpu_s"] = row["cpu"]["children_s"]
        return row

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
        future = self.executor.submit(run_load, self.load("create", seconds + 3.0))
        time.sleep(1.5)
        out = self.workdir / "create.pyspy.txt"
        spy = profiling.start(py_spy, self.server.pid, seconds, out)
        spy_output, _ = spy.communicate(timeout=seconds + 60)
        driven = future.result()
        if spy.returncode != 0 or not out.exists():
            self.profile_note = f"py-spy failed: {spy_output.strip()[-500:]}"
            return
        if self.args.profile_raw:
            self.args.profile_raw.write_text(out.read_text())
        self.profile = profiling.parse(out.read_text())
        self.profile_note = f"{driven.requests:,} creates during the profile"

    def figures(self) -> dict[str, dict[str, Any]]:
        out = {}
        for scenario in self.order:
            rounds = [r for r in self.rounds if r["scenario"] == scenario and r.get("ok", True)]
            if rounds:
                out[scenario] = summarize(rounds, self.latencies.get(scenario, []))
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
        console = Console(width=150)
    machine = machine_info()
    started = datetime.now(UTC)
    database = create_database()
    try:
        with tempfile.TemporaryDirectory(prefix="idempay-bench-") as tmp:
            bench = Bench(args, console, Path(tmp))
            try:
                bench.run(database)
                postgres = postgres_settings(database)
            finally:
                bench.close()
    finally:
        drop_database(database)
    figures = bench.figures()
    derived = ratios(figures)
    title = (
        f"{started:%Y-%m-%d %H:%M} UTC · git {machine['git']} · "
        f"{machine['nproc']} cores {machine['cpu_model']} · "
        f"Python {machine['python']} · Postgres {postgres['version']} · generator on the same "
        f"machine · concurrency {args.concurrency} · {args.rounds} rounds × {args.seconds:g} s"
    )
    waits = {name: bench.waits.summary(name) for name in figures} if bench.waits else {}
    context = {"title": title, "pgbench_note": bench.pgbench_note, "waits": waits}
    render(console, figures, derived, context)
    versus = peer_goals.peer_ratios(bench.rounds)
    verdicts = peer_goals.judge(versus)
    if versus:
        peer_goals.render(console, versus, verdicts)
    if args.profile:
        if bench.profile is not None:
            render_profile(console, bench.profile)
        console.print(bench.profile_note)
    failed = [
        name
        for name in bench.http_scenarios
        if name not in figures
        or figures[name]["error_pct"] > ERROR_BUDGET_PCT
        or not figures[name]["requests"]
    ]
    if args.json:
        derived = {**derived, "peers": versus, "goals": verdicts}  # type: ignore[dict-item]
        _write_json(args, bench, machine, postgres, started, figures, derived, waits)
    if failed:
        console.print(f"[red]FAILED[/]: errors over {ERROR_BUDGET_PCT} % in {', '.join(failed)}")
        return 1
    return 0


def _write_json(
    args: argparse.Namespace,
    bench: Bench,
    machine: dict[str, Any],
    postgres: dict[str, str],
    started: datetime,
    figures: dict[str, Any],
    derived: dict[str, Any],
    waits: dict[str, Any],
) -> None:
    document: dict[str, Any] = {
        "command": " ".join(["python -m loadtest.bench", *sys.argv[1:]]),
        "started_at": started.isoformat(),
        "machine": {**machine, "generator": "same machine, separate process"},
        "postgres": postgres,
        "options": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "figures": figures,
        "ratios": derived,
        "postgres_backends": waits,
        "rounds": bench.rounds,
    }
    if bench.profile is not None:
        document["profile"] = {
            "samples": bench.profile.samples,
            "self": bench.profile.top(bench.profile.self_time, 30),
            "packages": bench.profile.top(bench.profile.packages, 30),
            "sqlalchemy": bench.profile.top(bench.profile.sqlalchemy, 10),
            "inclusive": bench.profile.top(bench.profile.inclusive, 60),
        }
    args.json.write_text(json.dumps(document, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
