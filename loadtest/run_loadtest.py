"""``make loadtest``: the Locust fleet through the chaos proxy, then contract §8 on the database.

    python -m loadtest.run_loadtest [--run-time 60s] [--users 50] [--workers 2] [--loss 0.035]

1. a private Postgres database (``loadtest._bench_env``), migrated, with one API key;
2. ``python -m api serve --workers N`` on it (loopback, rate limits out of reach);
3. ``idempay_tools.chaos_proxy.ChaosProxy`` in front of it (``--loss``: half request drops,
   half response drops);
4. headless Locust, ``LossyTerminal`` and ``SdkTerminal``, bounded by ``--run-time``; its
   thresholds (fail ratio ≤ 1 %, p99 ≤ ``IDEMPAY_LT_MAX_P99_MS``) decide its exit code;
5. waits for the completer (no key left ``processing``), stops the server (flushing its
   request events), and checks the merchant's data: one charge per key, no charge without a
   transaction, no aborted key with a transaction, a balanced ledger, nothing stuck
   processing, and no 5xx in ``request_event``. There are no SDK journals to check here:
   Locust's users keep theirs in temporary directories.

Exits 1 when Locust failed or any invariant does not hold. The database is dropped at the
end, failure or not.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from locust.util.timespan import parse_timespan
from sqlalchemy import func, select

from idempay_tools.chaos_proxy import ChaosProxy
from loadtest import _bench_env
from loadtest._bench_env import say

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ("LossyTerminal", "SdkTerminal")
SERVER_ENV = {
    "IDEMPAY_DB_POOL_SIZE": "10",  # Postgres is shared with everything else on the machine
    "IDEMPAY_LEASE_SECONDS": "5",
    "IDEMPAY_COMPLETER_INTERVAL": "0.5",
}
SETTLE_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Checks:
    merchant: str
    transactions: int
    charges: int
    aborted_keys: int
    processing_keys: int
    unexpected_5xx: int
    requests_logged: int
    failures: dict[str, int]
    ledger_ok: bool
    violations: list[str]

    @property
    def rows(self) -> list[tuple[str, int]]:
        return [
            ("one_charge_per_key", self.failures.get("one_charge_per_key", 0)),
            ("charge_has_transaction", self.failures.get("charge_has_transaction", 0)),
            ("aborted_not_processed", self.failures.get("aborted_not_processed", 0)),
            ("ledger_balanced", self.failures.get("ledger_balanced", 0)),
            ("nothing_stuck_processing", self.processing_keys),
            ("unexpected_5xx", self.unexpected_5xx),
        ]

    @property
    def ok(self) -> bool:
        return all(count == 0 for _, count in self.rows)


async def _processing(database: str, merchant: str) -> int:
    from api.config import Settings
    from api.db import create_engine
    from api.models import IdempotencyKey

    engine = create_engine(Settings(database_url=_bench_env.database_url(database)))
    try:
        async with engine.connect() as conn:
            result = await conn.execute(
                select(func.count()).where(
                    IdempotencyKey.merchant_id == merchant, IdempotencyKey.state == "processing"
                )
            )
            return int(result.scalar_one())
    finally:
        await engine.dispose()


async def _merchant(database: str, api_key: str) -> str:
    from api.config import Settings
    from api.db import create_engine
    from idempay_tools.invariants import merchant_for_api_key

    engine = create_engine(Settings(database_url=_bench_env.database_url(database)))
    try:
        merchant = await merchant_for_api_key(engine, api_key)
    finally:
        await engine.dispose()
    if merchant is None:
        raise RuntimeError("the API key has no merchant")
    return merchant


async def _check(database: str, merchant: str) -> Checks:
    from api.config import Settings
    from api.db import create_engine
    from api.models import RequestEvent
    from idempay_tools.invariants import check_invariants

    engine = create_engine(Settings(database_url=_bench_env.database_url(database)))
    try:
        report = await check_invariants(engine, merchant_ids=[merchant])
        async with engine.connect() as conn:
            mine = RequestEvent.merchant_id == merchant
            errors = await conn.execute(
                select(func.count()).where(mine, RequestEvent.http_status >= 500)
            )
            logged = await conn.execute(select(func.count()).where(mine))
            unexpected, requests = int(errors.scalar_one()), int(logged.scalar_one())
    finally:
        await engine.dispose()
    return Checks(
        merchant=merchant,
        transactions=report.transactions,
        charges=report.charges,
        aborted_keys=report.aborted_keys,
        processing_keys=report.processing_keys,
        unexpected_5xx=unexpected,
        requests_logged=requests,
        failures=dict(report.failures),
        ledger_ok=all(balance.ok for balance in report.ledger),
        violations=[f"{v.invariant} {v.key}: {v.detail}" for v in report.violations],
    )


def _settle(database: str, merchant: str) -> int:
    """Wait until the completer has finished every key; the count still processing."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while (left := asyncio.run(_processing(database, merchant))) and time.monotonic() < deadline:
        time.sleep(1.0)
    return left


def _locust(args: argparse.Namespace, host: str, api_key: str) -> int:
    command = [
        sys.executable, "-m", "locust", "-f", str(ROOT / "loadtest" / "locustfile.py"),
        "--headless", "-u", str(args.users), "-r", str(args.spawn_rate),
        "--run-time", args.run_time, "--stop-timeout", "40", "--host", host,
        "--only-summary", *SCENARIOS,
    ]  # fmt: skip
    env = {**os.environ, "IDEMPAY_API_KEY": api_key}
    say("$ " + " ".join(command[1:]))
    proc = subprocess.Popen(command, cwd=ROOT, env=env)
    try:
        return proc.wait(timeout=parse_timespan(args.run_time) + 180)
    except BaseException:
        proc.kill()
        proc.wait()
        raise


def _print(checks: Checks, locust_rc: int, proxy_stats: dict[str, int]) -> None:
    say(f"\n== idempay invariants (merchant {checks.merchant}) ==")
    say(
        f"transactions {checks.transactions}  charges {checks.charges}  "
        f"aborted keys {checks.aborted_keys}  requests logged {checks.requests_logged}"
    )
    faults = {k: v for k, v in proxy_stats.items() if v and k not in ("connections", "passed")}
    say(f"chaos proxy: {faults}")
    for name, count in checks.rows:
        say(f"  {'OK  ' if count == 0 else 'FAIL'}  {name:<26} {count}")
    for line in checks.violations[:20]:
        say(f"    {line}")
    say(f"  {'OK  ' if locust_rc == 0 else 'FAIL'}  {'locust thresholds':<26} exit {locust_rc}")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m loadtest.run_loadtest", description=__doc__)
    parser.add_argument("--run-time", default="60s", help="Locust --run-time (default 60s)")
    parser.add_argument("--users", type=int, default=50)
    parser.add_argument("--spawn-rate", type=float, default=10)
    parser.add_argument("--workers", type=int, default=2, help="server worker processes")
    parser.add_argument("--loss", type=float, default=0.035, help="chaos proxy loss rate")
    parser.add_argument("--seed", type=int, default=1, help="chaos proxy seed")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    parse_timespan(args.run_time)  # fail early on a bad --run-time
    database = _bench_env.create_database()
    server: _bench_env.Server | None = None
    proxy = None
    try:
        api_key = _bench_env.prepare_database(database)
        merchant = asyncio.run(_merchant(database, api_key))
        log_path = Path(tempfile.mkdtemp(prefix="idempay-loadtest-")) / "server.log"
        server = _bench_env.Server(
            database, log_path, workers=args.workers, env=SERVER_ENV, bypass=False
        )
        server.start()
        proxy = ChaosProxy(
            target_host="127.0.0.1", target_port=server.port, seed=args.seed, loss=args.loss
        ).run_in_thread()
        say(
            f"server {server.url} ({args.workers} workers, log {log_path}); "
            f"chaos proxy 127.0.0.1:{proxy.port} loss {args.loss}"
        )
        locust_rc = _locust(args, f"http://127.0.0.1:{proxy.port}", api_key)
        proxy.stop()
        stats = proxy.stats
        proxy = None
        left = _settle(database, merchant)
        say(f"completer settled: {left} keys still processing")
        server.stop()  # flushes the request events
        server = None
        checks = asyncio.run(_check(database, merchant))
        _print(checks, locust_rc, stats)
        ok = checks.ok and locust_rc == 0
        say("\nloadtest: " + ("PASSED" if ok else "FAILED"))
        return 0 if ok else 1
    finally:
        if proxy is not None:
            proxy.stop()
        if server is not None:
            server.stop()
        _bench_env.drop_database(database)


if __name__ == "__main__":
    sys.exit(main())
