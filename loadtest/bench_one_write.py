# ruff: noqa: T201
"""The wired one-write create side by side with the general path, in one process.

    python -m loadtest.bench_one_write [--backend postgres|sqlite|both] [--rounds 3]
                                       [--seconds 4] [--concurrency 50]

Two ``TransactionService`` objects on the same database and engine, differing only in
``inline`` (None: the general path, SQLAlchemy, 8 round trips on Postgres / ``BEGIN
IMMEDIATE`` per create on SQLite; set: ``api/transactions/pg_create.py`` or
``sqlite_create.py``, as ``build_context`` wires it). 50 tasks in a closed loop call
``service.create`` with fresh keys, no HTTP; alternating rounds; creates/s and this
process's CPU µs per create (``time.process_time``: on SQLite that includes the writer
thread). Then every table is counted: the rows must all be equal.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from api.config import Settings
from api.idempotency.keys import body_fingerprint
from api.main import build_context
from api.transactions.schemas import TransactionCreate
from api.transactions.service import TransactionService
from loadtest import _bench_peers as peers
from loadtest._bench_env import create_database, database_url, drop_database, prepare_database

BODY = {
    "terminal_id": "T-0001",
    "amount": 1250,
    "currency": "BRL",
    "card": {"token": "tok_visa_4242", "last4": "4242", "brand": "visa"},
}
TABLES = (
    "idempotency_key",
    "issuer_authorization",
    '"transaction"',
    "ledger_entry",
    "outbox_event",
)


async def _drive(
    service: TransactionService, seconds: float, concurrency: int
) -> tuple[int, float, float]:
    body = TransactionCreate.model_validate(BODY)
    fingerprint = body_fingerprint(body)
    done = 0
    deadline = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            outcome = await service.create("bench", str(uuid.uuid4()), body, fingerprint)
            assert outcome.status == 201, outcome.body
            done += 1

    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done, time.process_time() - cpu, time.perf_counter() - wall


async def _compare(settings: Settings, args: argparse.Namespace) -> None:
    ctx = await build_context(settings)
    one_write = ctx.service
    general = TransactionService(ctx.engine, one_write.issuer, settings)
    variants = {"general": general, "one-write": one_write}
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    for service in variants.values():
        await _drive(service, 1.0, args.concurrency)
    for number in range(args.rounds):
        order = list(variants) if number % 2 == 0 else list(variants)[::-1]
        for name in order:
            done, cpu, wall = await _drive(variants[name], args.seconds, args.concurrency)
            results[name].append((done / wall, 1e6 * cpu / done))
            print(
                f"  round {number + 1} {name:<9} {done / wall:8,.0f}/s"
                f" {1e6 * cpu / done:7,.0f} CPU µs/create"
            )
    for name, rows in results.items():
        rate = statistics.median(r[0] for r in rows)
        cpu = statistics.median(r[1] for r in rows)
        print(f"  {name:<9} median {rate:8,.0f}/s {cpu:7,.0f} CPU µs/create")
    paired = [o[0] / g[0] for o, g in zip(results["one-write"], results["general"], strict=True)]
    cpu_ratio = [o[1] / g[1] for o, g in zip(results["one-write"], results["general"], strict=True)]
    print(
        f"  one-write ÷ general: rate {statistics.median(paired):.2f}"
        f" (per round {min(paired):.2f}–{max(paired):.2f}),"
        f" CPU per create {statistics.median(cpu_ratio):.2f}"
    )
    if one_write.inline is not None:
        await one_write.inline.close()
    counts = await _counts(ctx.engine)
    print("  rows (must all be equal):", counts)
    await ctx.engine.dispose()


async def _counts(engine: Any) -> dict[str, int]:
    from sqlalchemy import text

    async with engine.connect() as conn:
        return {
            t: (await conn.execute(text(f"SELECT count(*) FROM {t}"))).scalar_one() for t in TABLES
        }


def _run(settings: Settings, args: argparse.Namespace) -> None:
    import uvloop

    uvloop.run(_compare(settings, args))


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench_one_write")
    parser.add_argument("--backend", choices=("postgres", "sqlite", "both"), default="both")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--concurrency", type=int, default=50)
    args = parser.parse_args()
    if args.backend in ("postgres", "both"):
        print("Postgres")
        database = create_database()
        try:
            prepare_database(database)
            _run(Settings(database_url=database_url(database)), args)
        finally:
            drop_database(database)
    if args.backend in ("sqlite", "both"):
        print("SQLite")
        with tempfile.TemporaryDirectory(prefix="idempay-one-write-") as tmp:
            path = Path(tmp) / "idempay.db"
            peers.prepare_sqlite(path)
            _run(Settings(database_url=peers.sqlite_url(path)), args)


if __name__ == "__main__":
    main()
