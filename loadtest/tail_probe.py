"""Where the create's p99 comes from: GC pauses per server, the generator's own share.

    python -m loadtest.tail_probe [--targets create create-sqlite plain] [--rounds 4]
                                  [--seconds 4] [--concurrency 50] [--env K=V ...]
                                  [--profile TARGET --profile-seconds 8 --profile-out F]
                                  [--tree PATH] [--json F]

Starts idempay on a private Postgres database (``create``), idempay on a private SQLite file
(``create-sqlite``) and the bench's plain FastAPI peer (``plain``, Redis database 11 under a
private prefix), each with ``loadtest._gc_trace`` installed (every collection's pause per
generation). The bench's generator drives them in alternating rounds; per round and target:
req/s, p50/p99/p99.9, server CPU µs per request and the generator's CPU µs per request. At the
end each server writes its GC summary. ``--profile`` runs ``py-spy record`` (raw collapsed
stacks, ``--idle`` off) on one target during one extra round. ``--env`` is laid over the
idempay servers' environment (e.g. ``IDEMPAY_GC_FREEZE=false``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from loadtest import _bench_peers as peers
from loadtest._bench_driver import Load, run_load
from loadtest._bench_env import (
    Server,
    analyze,
    create_database,
    drop_database,
    prepare_database,
    sample_cpu,
    say,
)
from loadtest._bench_report import percentile

REDIS = "redis://127.0.0.1:6379/11"


def _traced(trace: Path, code: str) -> list[str]:
    return [
        sys.executable,
        "-c",
        f"import loadtest._gc_trace as t; t.install({str(trace)!r}); {code}",
    ]


class _TracedServer(Server):
    def __init__(self, trace: Path, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.trace = trace

    def command(self) -> list[str]:
        return _traced(
            self.trace,
            "from loadtest._bench_app import main; "
            f"main(['--port', '{self.port}', '--workers', '1'])",
        )


class _TracedPeer(peers.PeerServer):
    def __init__(self, trace: Path, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.trace = trace

    def command(self) -> list[str]:
        argv = super().command()[3:]  # after "python -m uvicorn"
        return _traced(self.trace, f"import uvicorn; uvicorn.main({argv!r})")


def _round(executor: ProcessPoolExecutor, server: Any, load: Load, db: str) -> dict[str, Any]:
    before = sample_cpu(server.pid, db)
    result = executor.submit(run_load, load).result()
    after = sample_cpu(server.pid, db)
    lat = sorted(result.latencies_ms)
    n = max(result.requests, 1)
    return {
        "rate": result.requests / result.elapsed_s,
        "errors": result.errors,
        "p50_ms": percentile(lat, 50),
        "p99_ms": percentile(lat, 99),
        "p999_ms": percentile(lat, 99.9),
        "max_ms": lat[-1] if lat else 0.0,
        "cpu_us": 1e6 * (after.server - before.server) / n,
        "pg_cpu_us": 1e6 * (after.postgres - before.postgres) / n,
        "client_cpu_us": 1e6 * result.cpu_s / n,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.tail_probe")
    parser.add_argument(
        "--targets", nargs="+", default=["create", "create-sqlite", "plain"],
        choices=["create", "create-sqlite", "plain"],
    )  # fmt: skip
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--env", nargs="*", default=[], help="K=V over the idempay servers")
    parser.add_argument("--profile", choices=["create", "create-sqlite", "plain"])
    parser.add_argument("--profile-seconds", type=int, default=8)
    parser.add_argument("--profile-out", type=Path)
    parser.add_argument("--tree", type=Path, help="serve idempay from this checkout")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    extra = dict(item.split("=", 1) for item in args.env)
    prefix = f"idempay-tail-probe-{os.getpid()}:"
    rows: list[dict[str, Any]] = []
    gc_stats: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="idempay-tail-") as tmp:
        work = Path(tmp)
        servers: dict[str, Any] = {}
        keys: dict[str, str] = {}
        dbs: dict[str, str] = {}
        database = ""
        try:
            for target in args.targets:
                trace = work / f"{target}.gc.json"
                if target == "create":
                    database = create_database()
                    keys[target], dbs[target] = prepare_database(database), database
                    server: Any = _TracedServer(trace, database, work / "pg.log", env=extra)
                elif target == "create-sqlite":
                    path = work / "sqlite" / "idempay.db"
                    path.parent.mkdir()
                    keys[target], dbs[target] = peers.prepare_sqlite(path), "-"
                    env = {"IDEMPAY_DATABASE_URL": peers.sqlite_url(path), **extra}
                    server = _TracedServer(trace, "-", work / "sqlite.log", env=env)
                else:
                    keys[target], dbs[target] = "plain", "-"
                    server = _TracedPeer(
                        trace, "plain_app", work / "plain.log", redis_url=REDIS, prefix=prefix
                    )
                if args.tree is not None and target != "plain":
                    server.cwd = args.tree
                server.start()
                servers[target] = server
            spawn = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as executor:
                for target, server in servers.items():  # warm-up
                    load = Load(server.url, keys[target], "create", 1.0, args.concurrency)
                    executor.submit(run_load, load).result()
                for server in servers.values():  # GC figures from here on: under load only
                    os.kill(server.pid, signal.SIGUSR2)
                for number in range(args.rounds):
                    if database:
                        analyze(database)
                    order = list(servers) if number % 2 == 0 else list(servers)[::-1]
                    for target in order:
                        load = Load(
                            servers[target].url, keys[target], "create", args.seconds,
                            args.concurrency,
                        )  # fmt: skip
                        row = {"round": number, "target": target}
                        row.update(_round(executor, servers[target], load, dbs[target]))
                        rows.append(row)
                        say(
                            f"round {number + 1} {target:<13} {row['rate']:>6,.0f}/s "
                            f"p50 {row['p50_ms']:5.1f} p99 {row['p99_ms']:6.1f} "
                            f"p99.9 {row['p999_ms']:6.1f} max {row['max_ms']:6.1f} ms  "
                            f"srv {row['cpu_us']:4,.0f} pg {row['pg_cpu_us']:4,.0f} "
                            f"client {row['client_cpu_us']:4,.0f} µs/req  err {row['errors']}"
                        )
                if args.profile and args.profile in servers:
                    _profile(executor, servers[args.profile], keys[args.profile], args)
            for server in servers.values():
                os.kill(server.pid, signal.SIGUSR1)
            time.sleep(0.5)
            for target in servers:
                trace = work / f"{target}.gc.json"
                if trace.exists():
                    gc_stats[target] = json.loads(trace.read_text())
        finally:
            for server in servers.values():
                server.stop()
            if database:
                drop_database(database)
            peers.clean_redis(REDIS, prefix)
    _report(rows, gc_stats, args.targets)
    if args.json:
        args.json.write_text(json.dumps({"rounds": rows, "gc": gc_stats}, indent=2) + "\n")
    return 0


def _profile(executor: ProcessPoolExecutor, server: Any, key: str, args: Any) -> None:
    out = args.profile_out or Path(f"/tmp/tail-probe-{args.profile}.txt")
    spy = subprocess.Popen(
        [str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(server.pid),
         "--duration", str(args.profile_seconds), "--rate", "250", "--format", "raw",
         "--output", str(out), "--nonblocking", "--threads"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    time.sleep(0.5)
    load = Load(server.url, key, "create", args.profile_seconds, args.concurrency)
    executor.submit(run_load, load).result()
    spy.wait(timeout=60)
    say(f"py-spy raw stacks: {out}")


def _report(rows: list[dict[str, Any]], gc_stats: dict[str, Any], targets: list[str]) -> None:
    say("\nmedians over rounds:")
    for target in targets:
        mine = [r for r in rows if r["target"] == target]
        if not mine:
            continue
        med = {k: statistics.median(r[k] for r in mine) for k in mine[0] if k not in ("target",)}
        say(
            f"  {target:<13} {med['rate']:>6,.0f}/s p50 {med['p50_ms']:5.1f} "
            f"p99 {med['p99_ms']:6.1f} p99.9 {med['p999_ms']:6.1f} ms "
            f"srv {med['cpu_us']:4,.0f} client {med['client_cpu_us']:4,.0f} µs/req"
        )
        stats = gc_stats.get(target)
        if stats:
            for gen, g in stats["generations"].items():
                say(
                    f"      gc gen {gen}: {g['count']:6.0f} collections, total "
                    f"{g['total_ms']:8.1f} ms, max {g['max_ms']:6.2f} ms, "
                    f">5 ms: {g['over_5ms']:.0f} (over {stats['seconds']:.0f} s; "
                    f"threshold {stats['threshold']}, frozen {stats['frozen']})"
                )
            say(f"      gen-2 pauses ms: {[pause for _t, pause in stats['full']]}")


if __name__ == "__main__":
    raise SystemExit(main())
