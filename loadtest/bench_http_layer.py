"""What the slow-client HTTP layer costs: the same app under uvicorn's plain httptools
protocol and under ``api.http_limits.SlowClientHttpToolsProtocol`` (header deadline,
header cap, lingering close — what ``idempay serve`` runs), side by side in one run.

    python -m loadtest.bench_http_layer [--rounds 6] [--seconds 5] [--concurrency 50]

Two servers on one private bench database (one worker each, started the same way by
``python -m uvicorn api.main:create_app --factory`` with only ``--http`` different). Rounds
alternate ABBA over the scenarios ``lookup`` (cheapest request: the HTTP layer's largest
share) and ``create``; each round's ratio guarded ÷ plain is paired, and the median over
rounds is printed with its range. The database is dropped at the end.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import uuid
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from loadtest import _bench_env
from loadtest._bench_driver import Load, RoundResult, run_load
from loadtest._bench_env import say

PROTOCOLS = {
    "plain": "httptools",
    "guarded": "api.http_limits:SlowClientHttpToolsProtocol",
}
SCENARIOS = ("lookup", "create")


class UvicornServer(_bench_env.Server):
    """The app under uvicorn directly, so that only the HTTP protocol class differs."""

    def __init__(self, database: str, log_path: Path, *, http: str) -> None:
        super().__init__(database, log_path)
        self.http = http

    def command(self) -> list[str]:
        return [sys.executable, "-m", "uvicorn", "api.main:create_app", "--factory",
                "--host", "127.0.0.1", "--port", str(self.port), "--loop", "uvloop",
                "--http", self.http, "--no-access-log", "--log-level", "warning",
                "--timeout-keep-alive", "30"]  # fmt: skip


def _rate(result: RoundResult) -> float:
    return result.requests / result.elapsed_s if result.elapsed_s else 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench_http_layer")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--pool", type=int, default=500)
    args = parser.parse_args(argv)
    database = _bench_env.create_database()
    workdir = Path(tempfile.mkdtemp(prefix="idempay-bench-http-"))
    servers: dict[str, UvicornServer] = {}
    try:
        api_key = _bench_env.prepare_database(database)
        for name, http in PROTOCOLS.items():
            servers[name] = UvicornServer(database, workdir / f"{name}.log", http=http)
            servers[name].start()
        pool = tuple(str(uuid.uuid4()) for _ in range(args.pool))
        rates: dict[tuple[str, str], list[float]] = {}
        errors = 0
        with ProcessPoolExecutor(1) as executor:
            seed = Load(servers["plain"].url, api_key, "seed", 600.0, args.concurrency, pool)
            seeded = executor.submit(run_load, seed).result()
            if seeded.errors:
                raise RuntimeError(f"seeding failed: {seeded.statuses}")
            for scenario in SCENARIOS:  # warm both up
                for server in servers.values():
                    load = Load(server.url, api_key, scenario, 1.0, args.concurrency, pool)
                    executor.submit(run_load, load).result()
            for round_no in range(args.rounds):
                order = list(PROTOCOLS) if round_no % 2 == 0 else list(reversed(PROTOCOLS))
                for scenario in SCENARIOS:
                    for name in order:
                        load = Load(
                            servers[name].url,
                            api_key,
                            scenario,
                            args.seconds,
                            args.concurrency,
                            pool,
                        )
                        result = executor.submit(run_load, load).result()
                        errors += result.errors
                        rates.setdefault((scenario, name), []).append(_rate(result))
        say(f"\nHTTP layer cost: {args.rounds} ABBA rounds × {args.seconds:g} s, "
              f"concurrency {args.concurrency}, one worker each\n")  # fmt: skip
        say(f"{'scenario':<8} {'plain req/s':>12} {'guarded req/s':>14} "
              f"{'guarded÷plain (paired median)':>30} {'range':>14}")  # fmt: skip
        for scenario in SCENARIOS:
            plain, guarded = rates[(scenario, "plain")], rates[(scenario, "guarded")]
            paired = [g / p for g, p in zip(guarded, plain, strict=True) if p]
            say(
                f"{scenario:<8} {statistics.median(plain):>12.0f} "
                f"{statistics.median(guarded):>14.0f} {statistics.median(paired):>30.3f} "
                f"{min(paired):>6.3f}–{max(paired):.3f}"
            )
        say(f"\nerrors: {errors}")
        return 1 if errors else 0
    finally:
        for server in servers.values():
            server.stop()
        _bench_env.drop_database(database)


if __name__ == "__main__":
    sys.exit(main())
