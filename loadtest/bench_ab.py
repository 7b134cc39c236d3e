"""Two versions of the server side by side: the working tree against a git revision.

    python -m loadtest.bench_ab [--base HEAD] [--scenarios create replay lookup]
                                [--new-tree PATH] [--rounds 6] [--seconds 3]
                                [--concurrency 50] [--backend postgres] [--json F]

For a change to the request path, one run of ``make bench`` on this shared machine moves its
ratios by ±0.2 between identical runs; what a change is worth needs both versions measured
in the same minutes. This harness checks ``--base`` out into a temporary git worktree and
starts the bench's server (``python -m loadtest._bench_app``, one worker) from it and
another from the working tree — or from ``--new-tree``, e.g. a worktree holding one change
alone while the working tree also holds others' work in progress. Each server has a private
database, migrated by this tree (the schema is the same unless the change adds a
migration). The bench's closed-loop generator drives them in alternating rounds (A B, then
B A). Per round and server: requests per second, p99, and server CPU µs per request from
``/proc``; the figures printed are the medians of the per-round paired ratios (new ÷ base).
``--base-tree`` measures a checkout as the base (no worktree); with ``--base-env`` /
``--new-env`` the same tree can be compared against itself under two settings.
CPU per request is the steadier figure: throughput also moves with what the other sessions
run on the same cores.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import subprocess
import tempfile
import uuid
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from loadtest import _bench_peers as peers
from loadtest._bench_driver import Load, run_load
from loadtest._bench_env import (
    ROOT,
    Server,
    analyze,
    create_database,
    drop_database,
    prepare_database,
    sample_cpu,
    say,
)
from loadtest._bench_report import percentile


class _TreeServer(Server):
    """The bench's server run from another checkout (``python -m`` puts the cwd first on
    ``sys.path``, so that tree's ``api`` is the one imported)."""

    def __init__(self, tree: Path, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cwd = tree


def _worktree(base: str, where: Path) -> Path:
    subprocess.run(
        ["git", "worktree", "add", "--detach", "--quiet", str(where), base], cwd=ROOT, check=True
    )
    return where


def _remove_worktree(where: Path) -> None:
    subprocess.run(
        ["git", "worktree", "remove", "--force", str(where)], cwd=ROOT, capture_output=True
    )


def _round(
    executor: ProcessPoolExecutor, server: Server, load: Load, database: str
) -> dict[str, Any]:
    before = sample_cpu(server.pid, database)
    result = executor.submit(run_load, load).result()
    after = sample_cpu(server.pid, database)
    rate = result.requests / result.elapsed_s
    return {
        "rate": rate,
        "errors": result.errors,
        "p99_ms": percentile(sorted(result.latencies_ms), 99),
        "cpu_us": 1e6 * (after.server - before.server) / max(result.requests, 1),
        "pg_cpu_us": 1e6 * (after.postgres - before.postgres) / max(result.requests, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench_ab")
    parser.add_argument("--base", default="HEAD", help="git revision to compare against")
    parser.add_argument(
        "--new-tree",
        type=Path,
        default=ROOT,
        help="the checkout to measure (default: this working tree)",
    )
    parser.add_argument(
        "--base-tree",
        type=Path,
        help="measure this checkout as the base instead of a worktree of --base",
    )
    parser.add_argument(
        "--base-env", nargs="*", default=[], help="K=V over the base server's environment"
    )
    parser.add_argument(
        "--new-env", nargs="*", default=[], help="K=V over the new server's environment"
    )
    parser.add_argument("--scenarios", nargs="+", default=["create", "replay", "lookup"])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--pool", type=int, default=500, help="keys for replay/lookup")
    parser.add_argument("--backend", choices=["postgres", "sqlite"], default="postgres")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    rev = subprocess.run(
        ["git", "rev-parse", "--short", args.base], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    if args.base_tree is not None:
        rev = f"{args.base_tree}"
    extra = {
        "base": dict(item.split("=", 1) for item in args.base_env),
        "new": dict(item.split("=", 1) for item in args.new_env),
    }
    say(f"base {args.base} ({rev}) {extra['base']} against {args.new_tree} {extra['new']},"
        f" {args.backend}")  # fmt: skip
    rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="idempay-ab-") as tmp:
        workdir = Path(tmp)
        tree = args.base_tree or _worktree(args.base, workdir / "base")
        databases: list[str] = []
        servers: dict[str, Server] = {}
        keys: dict[str, str] = {}
        try:
            for name, root in (("base", tree), ("new", args.new_tree)):
                env: dict[str, str] = dict(extra[name])
                if args.backend == "postgres":
                    database = create_database()
                    databases.append(database)
                    keys[name] = prepare_database(database)
                else:
                    database = "-"
                    path = workdir / f"{name}-sqlite" / "idempay.db"  # not the worktree
                    path.parent.mkdir(parents=True)
                    keys[name] = peers.prepare_sqlite(path)
                    env["IDEMPAY_DATABASE_URL"] = peers.sqlite_url(path)
                server = _TreeServer(root, database, workdir / f"{name}.log", env=env)
                server.start()
                servers[name] = server
            dbs = dict(zip(("base", "new"), databases or ["-", "-"], strict=True))
            pool = tuple(str(uuid.uuid4()) for _ in range(args.pool))
            spawn = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as executor:
                for name, server in servers.items():
                    load = Load(server.url, keys[name], "seed", 600.0, args.concurrency, pool)
                    executor.submit(run_load, load).result()
                    for scenario in args.scenarios:  # warm-up
                        load = Load(server.url, keys[name], scenario, 1.0, args.concurrency, pool)
                        executor.submit(run_load, load).result()
                for number in range(args.rounds):
                    for database in databases:  # autovacuum's part (_bench_env.analyze)
                        analyze(database)
                    order = ["base", "new"] if number % 2 == 0 else ["new", "base"]
                    for scenario in args.scenarios:
                        for name in order:
                            server = servers[name]
                            load = Load(
                                server.url,
                                keys[name],
                                scenario,
                                args.seconds,
                                args.concurrency,
                                pool,
                            )
                            row = _round(executor, server, load, dbs[name])
                            rounds.append(
                                {"round": number, "scenario": scenario, "server": name, **row}
                            )
                            say(
                                f"round {number + 1} {scenario:<7} {name:<4} "
                                f"{row['rate']:>7,.0f}/s  cpu {row['cpu_us']:>5,.0f} µs/req  "
                                f"p99 {row['p99_ms']:>6.1f} ms  errors {row['errors']}"
                            )
        finally:
            for server in servers.values():
                server.stop()
            for database in databases:
                drop_database(database)
            if args.base_tree is None:
                _remove_worktree(tree)
    summary = _summary(rounds, args.scenarios, args.rounds)
    say(f"\nnew ÷ base ({args.base} = {rev}), medians of per-round pairs:")
    for scenario, figures in summary.items():
        say(
            f"  {scenario:<7} throughput {figures['rate_ratio']:.3f} "
            f"({figures['rate_range'][0]:.2f}–{figures['rate_range'][1]:.2f})  "
            f"cpu µs/req {figures['cpu_base']:,.0f} → {figures['cpu_new']:,.0f} "
            f"(ratio {figures['cpu_ratio']:.3f})  p99 ratio {figures['p99_ratio']:.2f}"
        )
    if args.json:
        args.json.write_text(
            json.dumps({"base": rev, "rounds": rounds, "summary": summary}, indent=2) + "\n"
        )
    return 1 if any(r["errors"] for r in rounds) else 0


def _summary(
    rounds: list[dict[str, Any]], scenarios: list[str], count: int
) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for scenario in scenarios:
        pairs = []
        for number in range(count):
            row = {
                r["server"]: r for r in rounds if r["round"] == number and r["scenario"] == scenario
            }
            pairs.append((row["base"], row["new"]))
        rate = [new["rate"] / base["rate"] for base, new in pairs]
        cpu = [new["cpu_us"] / base["cpu_us"] for base, new in pairs]
        p99 = [new["p99_ms"] / base["p99_ms"] for base, new in pairs]
        out[scenario] = {
            "rate_ratio": statistics.median(rate),
            "rate_range": [min(rate), max(rate)],
            "cpu_ratio": statistics.median(cpu),
            "cpu_base": statistics.median(base["cpu_us"] for base, _ in pairs),
            "cpu_new": statistics.median(new["cpu_us"] for _, new in pairs),
            "p99_ratio": statistics.median(p99),
        }
    return out


if __name__ == "__main__":
    raise SystemExit(main())
