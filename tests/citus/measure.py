"""What a create costs on Citus, beside plain Postgres on the same node (docs/scaling.md).

    python -m tests.citus.measure [--clients 8] [--creates 2000] [--merchants 32] [--api]

Starts a private cluster (scripts/citus.sh, in a temporary folder), makes a Citus database
(migrated: distributed) and a plain one on the coordinator's own server (same binaries,
same disk), and runs the create's rows — key, transaction, ledger entry, outbox event —
from ``--clients`` concurrent connections for random merchants, two ways:

- ``tx``: one transaction of four statements, each routed to the merchant's shard (the
  general path's shape, what runs on Citus until the one-write create has a Citus form);
- ``fn``: one call of a PL/pgSQL function doing the same four inserts, distributed by its
  merchant argument and colocated with ``idempotency_key``, so Citus delegates the whole call
  to the worker holding the merchant's shard (the proposed Citus form of the one-write
  create).

and, with ``--api``, the whole create through idempay itself: ``POST /v1/transactions`` to a
server (``idempay serve``, one worker) on each database, from as many concurrent clients —
whatever path the checked-out code takes there: the claim, one 0200 to the simulated
acquirer host the server starts as its child, the finish.

For each: creates/s, median latency, and the CPU time each node's server processes spent
per create (from /proc, all backends of the node's postmaster), which is what sizes a node.
Numbers from this machine are relative: its nodes share the machine's cores and disk.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import asyncpg

from api.config import Settings
from api.migrate import migrate
from tests.support.backend import Backend
from tests.support.citus import CitusCluster, Node, execute
from tests.support.client import body

KEY = (
    "INSERT INTO idempotency_key (merchant_id, key, state, fingerprint, lease_token, terminal_id,"
    " response_status, response_body, created_at, updated_at)"
    " VALUES ($1, $2, 'completed', $3, 1, $4, 201, $5, $6, $6) ON CONFLICT DO NOTHING RETURNING key"
)
TRANSACTION = (
    'INSERT INTO "transaction" (merchant_id, id, terminal_id, type, amount, currency, card_last4,'
    " card_brand, card_fingerprint, installments, status, authorization_code, created_at,"
    " processed_at) VALUES ($1, $2, $3, 'sale', $4, 'BRL', '4242', 'visa', 'fp', 1, 'approved',"
    " 'A1B2C3', $5, $5)"
)
LEDGER = (
    "INSERT INTO ledger_entry (merchant_id, entry_id, transaction_id, amount, currency, kind,"
    " created_at) VALUES ($1, $2, $3, $4, 'BRL', 'charge', $5)"
)
OUTBOX = (
    "INSERT INTO outbox_event (merchant_id, event_id, type, transaction_id, payload, created_at)"
    " VALUES ($1, $2, 'transaction.completed', $3, $4, $5)"
)
FUNCTION = """
CREATE OR REPLACE FUNCTION idempay_measure_create(
  m text, k text, fp text, terminal text, response text, amount bigint,
  entry text, event text, payload text, now_ timestamptz) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO idempotency_key (merchant_id, key, state, fingerprint, lease_token, terminal_id,
    response_status, response_body, created_at, updated_at)
  VALUES (m, k, 'completed', fp, 1, terminal, 201, response, now_, now_) ON CONFLICT DO NOTHING;
  IF NOT FOUND THEN RETURN false; END IF;
  INSERT INTO "transaction" (merchant_id, id, terminal_id, type, amount, currency, card_last4,
    card_brand, card_fingerprint, installments, status, authorization_code, created_at,
    processed_at) VALUES (m, k, terminal, 'sale', amount, 'BRL', '4242', 'visa', 'fp', 1,
    'approved', 'A1B2C3', now_, now_);
  INSERT INTO ledger_entry (merchant_id, entry_id, transaction_id, amount, currency, kind,
    created_at) VALUES (m, entry, k, amount, 'BRL', 'charge', now_);
  INSERT INTO outbox_event (merchant_id, event_id, type, transaction_id, payload, created_at)
    VALUES (m, event, 'transaction.completed', k, payload, now_);
  RETURN true;
END $$
"""
SIGNATURE = (
    "idempay_measure_create(text, text, text, text, text, bigint, text, text, text, timestamptz)"
)
CALL = "SELECT idempay_measure_create($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"
BODY = '{"id":"%s","status":"approved","amount":700}'


async def create_tx(conn: asyncpg.Connection, merchant: str) -> None:
    key, now = str(uuid.uuid4()), datetime.now(UTC)
    async with conn.transaction():
        assert await conn.fetchval(KEY, merchant, key, "fp", "T-1", BODY % key, now) == key
        await conn.execute(TRANSACTION, merchant, key, "T-1", 700, now)
        await conn.execute(LEDGER, merchant, str(uuid.uuid4()), key, 700, now)
        await conn.execute(OUTBOX, merchant, str(uuid.uuid4()), key, "{}", now)


async def create_fn(conn: asyncpg.Connection, merchant: str) -> None:
    key, now = str(uuid.uuid4()), datetime.now(UTC)
    args = (merchant, key, "fp", "T-1", BODY % key, 700)
    assert await conn.fetchval(CALL, *args, str(uuid.uuid4()), str(uuid.uuid4()), "{}", now)


def cpu_seconds(node: Node) -> float:
    """User + system CPU of the node's postmaster and every backend it forked."""
    ticks = os.sysconf("SC_CLK_TCK")
    postmaster = node.pid()
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid, ppid = int(entry.name), int(fields[1])
        if postmaster in (pid, ppid):
            total += (int(fields[11]) + int(fields[12])) / ticks
    return total


async def run(
    dsn: str,
    create: Callable[[asyncpg.Connection, str], Awaitable[None]],
    *,
    clients: int,
    creates: int,
    merchants: list[str],
    nodes: list[Node],
) -> dict[str, float]:
    conns = [await asyncpg.connect(dsn) for _ in range(clients)]
    latencies: list[float] = []
    for conn in conns:  # warm: plans cached, connections to the workers open
        for _ in range(5):
            await create(conn, random.choice(merchants))
    before = [cpu_seconds(node) for node in nodes]

    async def client(conn: asyncpg.Connection, count: int) -> None:
        for _ in range(count):
            started = time.perf_counter()
            await create(conn, random.choice(merchants))
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(client(conn, creates // clients) for conn in conns))
    elapsed = time.perf_counter() - started
    spent = [cpu_seconds(node) - was for node, was in zip(nodes, before, strict=True)]
    for conn in conns:
        await conn.close()
    done = len(latencies)
    result = {"creates/s": done / elapsed, "p50 ms": statistics.median(latencies) * 1000}
    for node, seconds in zip(nodes, spent, strict=True):
        result[f"{node.name} cpu ms/create"] = seconds / done * 1000
    return result


async def through_api(
    url: str, keys: list[str], *, clients: int, creates: int, nodes: list[Node]
) -> dict[str, float]:
    """Creates over HTTP, ``clients`` at a time, for random merchants (their API keys)."""
    latencies: list[float] = []
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(url, timeout=timeout) as http:

        async def one() -> None:
            started = time.perf_counter()
            headers = {
                "Authorization": f"Bearer {random.choice(keys)}",
                "Idempotency-Key": str(uuid.uuid4()),
            }
            async with http.post("/v1/transactions", json=body(), headers=headers) as answer:
                assert answer.status == 201, await answer.text()
            latencies.append(time.perf_counter() - started)

        async def client(count: int) -> None:
            for _ in range(count):
                await one()

        await asyncio.gather(*(client(5) for _ in range(clients)))  # warm
        latencies.clear()
        before = [cpu_seconds(node) for node in nodes]
        started = time.perf_counter()
        await asyncio.gather(*(client(creates // clients) for _ in range(clients)))
        elapsed = time.perf_counter() - started
        spent = [cpu_seconds(node) - was for node, was in zip(nodes, before, strict=True)]
    done = len(latencies)
    result = {"creates/s": done / elapsed, "p50 ms": statistics.median(latencies) * 1000}
    for node, seconds in zip(nodes, spent, strict=True):
        result[f"{node.name} cpu ms/create"] = seconds / done * 1000
    return result


def api_runs(
    cluster: CitusCluster, databases: dict[str, str], root: Path, args: argparse.Namespace
) -> None:
    for name, database in databases.items():
        folder = root / database
        folder.mkdir(parents=True, exist_ok=True)
        backend = Backend("measure", cluster.url(database), folder)
        server = backend.server(IDEMPAY_DB_POOL_SIZE=str(args.clients))
        try:
            keys = [backend.api_key(f"measure-{n:03d}") for n in range(args.merchants)]
            nodes = list(cluster.nodes.values()) if "Citus" in name else [cluster.coordinator]
            result = asyncio.run(
                through_api(
                    server.url, keys, clients=args.clients, creates=args.creates, nodes=nodes
                )
            )
        finally:
            backend.stop_all()
        print(f"{name:32} " + "  ".join(f"{k} {v:,.2f}" for k, v in result.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--creates", type=int, default=2000)
    parser.add_argument("--merchants", type=int, default=32)
    parser.add_argument("--api", action="store_true", help="also through idempay serve")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="idempay-citus-measure-"))
    cluster = CitusCluster(root).start()
    try:
        citus_db = cluster.database("idempay_measure")
        migrate(Settings(database_url=cluster.url(citus_db), var_dir=root / "var"))
        plain_db = f"idempay_measure_plain_{uuid.uuid4().hex[:6]}"
        asyncio.run(execute(cluster.coordinator.dsn(), f'CREATE DATABASE "{plain_db}"'))
        migrate(Settings(database_url=cluster.url(plain_db), var_dir=root / "var"))
        citus_dsn, plain_dsn = cluster.coordinator.dsn(citus_db), cluster.coordinator.dsn(plain_db)
        asyncio.run(execute(plain_dsn, FUNCTION))
        asyncio.run(execute(citus_dsn, FUNCTION))
        asyncio.run(
            execute(
                citus_dsn,
                f"SELECT create_distributed_function('{SIGNATURE}', 'm', "
                "colocate_with := 'idempotency_key')",
            )
        )
        merchants = [f"mer_measure_{n:03d}" for n in range(args.merchants)]
        nodes = list(cluster.nodes.values())
        runs = {
            "plain Postgres, tx": (plain_dsn, create_tx, [cluster.coordinator]),
            "plain Postgres, fn": (plain_dsn, create_fn, [cluster.coordinator]),
            "Citus, tx (routed statements)": (citus_dsn, create_tx, nodes),
            "Citus, fn (delegated call)": (citus_dsn, create_fn, nodes),
        }
        print(f"{args.clients} clients, {args.creates} creates, {args.merchants} merchants")
        for name, (dsn, create, measured) in runs.items():
            result = asyncio.run(
                run(
                    dsn,
                    create,
                    clients=args.clients,
                    creates=args.creates,
                    merchants=merchants,
                    nodes=measured,
                )
            )
            print(f"{name:32} " + "  ".join(f"{k} {v:,.2f}" for k, v in result.items()))
        if args.api:
            databases = {"plain Postgres, API": plain_db, "Citus, API": citus_db}
            api_runs(cluster, databases, root, args)
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
