"""What a create costs on Citus, beside plain Postgres on the same node (docs/scaling.md).

    python -m tests.citus.measure [--clients 8] [--creates 2000] [--merchants 32] [--api]
                                  [--floor]

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

With ``--floor``, also the create's two minimal durable transactions as delegated calls
(functions distributed by their merchant argument, colocated with ``idempotency_key``): the
claim (one ``INSERT … ON CONFLICT DO NOTHING RETURNING`` of the key ``processing``, as
``store.claim_row``) and the finish (the lease-guarded ``UPDATE`` to ``completed``, as
``store.complete``, and the transaction, ledger entry and outbox event), one call each, the
claim committed before the finish is sent — what the ideal Citus create would send; a no-op
delegated call (Citus' fixed cost per call); and a request event as the Citus event writer
sends one (a routed one-row ``INSERT``). Then the bound those same-run figures put on the
API rows' ratio (``floor``).

For each: creates/s, median latency, and the CPU time each node's server processes spent
per create (from /proc, all backends of the node's postmaster), which is what sizes a node;
for the API rows also the CPU per create of the server process, of its acquirer host, of
this process (the load generator), and how busy the machine's cores were (/proc/stat).
Numbers from this machine are relative: its nodes share the machine's cores and disk.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp
import asyncpg

from api.config import Settings
from api.events.writer import citus_insert
from api.migrate import migrate
from tests.support.backend import Backend
from tests.support.citus import CitusCluster, Node, execute
from tests.support.client import body
from tests.support.services import Server

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

# --floor: the create's two durable transactions as the ideal Citus create would send them,
# one delegated call each (distributed by ``m``, colocated with ``idempotency_key``).
CLAIM_FUNCTION = """
CREATE OR REPLACE FUNCTION idempay_measure_claim(
  m text, k text, fp text, terminal text, request text, now_ timestamptz,
  lease_until_ timestamptz, deadline timestamptz) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE token integer;
BEGIN
  INSERT INTO idempotency_key (merchant_id, key, state, fingerprint, lease_token, lease_until,
    request, terminal_id, created_at, updated_at, deadline_at)
  VALUES (m, k, 'processing', fp, 1, lease_until_, request, terminal, now_, now_, deadline)
  ON CONFLICT DO NOTHING RETURNING lease_token INTO token;
  RETURN token;
END $$
"""
FINISH_FUNCTION = """
CREATE OR REPLACE FUNCTION idempay_measure_finish(
  m text, k text, token integer, terminal text, response text, amount bigint,
  entry text, event text, payload text, now_ timestamptz) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
  UPDATE idempotency_key SET state = 'completed', response_status = 201,
    response_body = response, request = NULL, lease_until = NULL, updated_at = now_
  WHERE merchant_id = m AND key = k AND state = 'processing' AND lease_token = token;
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
NOOP_FUNCTION = """
CREATE OR REPLACE FUNCTION idempay_measure_noop(m text) RETURNS boolean
LANGUAGE plpgsql AS $$ BEGIN RETURN true; END $$
"""
FLOOR_FUNCTIONS = {  # signature → definition
    "idempay_measure_claim(text, text, text, text, text, timestamptz, timestamptz, timestamptz)": (
        CLAIM_FUNCTION
    ),
    "idempay_measure_finish(text, text, integer, text, text, bigint, text, text, text, "
    "timestamptz)": FINISH_FUNCTION,
    "idempay_measure_noop(text)": NOOP_FUNCTION,
}
CLAIM_CALL = "SELECT idempay_measure_claim($1, $2, $3, $4, $5, $6, $7, $8)"
FINISH_CALL = "SELECT idempay_measure_finish($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"
NOOP_CALL = "SELECT idempay_measure_noop($1)"
# each function called with constants, for EXPLAIN: a delegated call is one task on a worker
EXPLAINED = {
    "claim": "SELECT idempay_measure_claim('{m}', 'k', 'fp', 'T-1', '{{}}',"
    " '2026-01-01Z', '2026-01-01Z', '2026-01-01Z')",
    "finish": "SELECT idempay_measure_finish('{m}', 'k', 1, 'T-1', 'b', 700, 'e', 'v', '{{}}',"
    " '2026-01-01Z')",
    "no-op": "SELECT idempay_measure_noop('{m}')",
}
REQUEST = json.dumps(body(), separators=(",", ":"))  # the claim stores the request
EVENT = citus_insert(1)  # a request event as the Citus event writer sends one row


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


async def create_floor(conn: asyncpg.Connection, merchant: str) -> None:
    """The claim, committed, then the finish: two calls, two transactions."""
    key, now = str(uuid.uuid4()), datetime.now(UTC)
    lease, deadline = now + timedelta(seconds=30), now + timedelta(seconds=60)
    claim = (merchant, key, "fp", "T-1", REQUEST, now, lease, deadline)
    token = await conn.fetchval(CLAIM_CALL, *claim)
    assert token == 1, token
    finish = (merchant, key, token, "T-1", BODY % key, 700, str(uuid.uuid4()), str(uuid.uuid4()))
    assert await conn.fetchval(FINISH_CALL, *finish, "{}", datetime.now(UTC))


async def call_noop(conn: asyncpg.Connection, merchant: str) -> None:
    assert await conn.fetchval(NOOP_CALL, merchant)


async def write_event(conn: asyncpg.Connection, merchant: str) -> None:
    now = datetime.now(UTC)
    row = (str(uuid.uuid4()), now, merchant, "T-1", str(uuid.uuid4()), "create", "created")
    await conn.execute(EVENT, *row, 201, 1, "visa", 12.5)


def _processes() -> dict[int, tuple[int, float]]:
    """Every process: its parent and its user + system CPU seconds."""
    ticks = os.sysconf("SC_CLK_TCK")
    found: dict[int, tuple[int, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        found[int(entry.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / ticks)
    return found


def cpu_seconds(node: Node) -> float:
    """User + system CPU of the node's postmaster and every backend it forked."""
    postmaster = node.pid()
    return sum(cpu for pid, (ppid, cpu) in _processes().items() if postmaster in (pid, ppid))


def _is_acquirer_host(pid: int) -> bool:
    try:
        return b"api.acquirer.host" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def server_cpu(root: int) -> tuple[float, float]:
    """User + system CPU of an ``idempay serve`` tree: (the server's processes, its acquirer
    host's) — the host a child started by the server, told apart by its command line."""
    processes = _processes()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in processes.items():
        children.setdefault(ppid, []).append(pid)
    server = host = 0.0
    pending = [(root, False)]
    while pending:
        pid, in_host = pending.pop()
        in_host = in_host or _is_acquirer_host(pid)
        cpu = processes.get(pid, (0, 0.0))[1]
        if in_host:
            host += cpu
        else:
            server += cpu
        pending.extend((child, in_host) for child in children.get(pid, []))
    return server, host


def own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def machine_ticks() -> tuple[int, int]:
    """The machine's busy and total CPU ticks, all cores (/proc/stat; idle and iowait are
    not busy)."""
    fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return sum(fields) - fields[3] - fields[4], sum(fields)


Result = dict[str, float]
WARM = 5  # creates per client before the measured ones


async def _counters(node: Node, database: str) -> tuple[int, int]:
    """The database's committed transactions on ``node`` and the node's WAL fsyncs."""
    conn = await asyncpg.connect(node.dsn(database))
    try:
        xacts = await conn.fetchval(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        )
        return int(xacts), int(await conn.fetchval("SELECT wal_sync FROM pg_stat_wal"))
    finally:
        await conn.close()


def counters(nodes: list[Node], database: str) -> list[tuple[int, int]]:
    return [asyncio.run(_counters(node, database)) for node in nodes]


def commits(
    result: Result, nodes: list[Node], database: str, before: list[tuple[int, int]], count: int
) -> None:
    """Transactions committed in ``database`` and WAL fsyncs per create, node by node, since
    ``before``, over ``count`` creates (the warm ones included: the counters are read before
    them). Read once the connections closed (a backend's counts reach the statistics at its
    exit at the latest)."""
    time.sleep(1.0)
    unit = next(k for k in result if k.endswith("s/s"))[:-3]
    for node, (xacts, syncs) in zip(nodes, before, strict=True):
        xacts_after, syncs_after = asyncio.run(_counters(node, database))
        result[f"{node.name} xacts/{unit}"] = (xacts_after - xacts) / count
        result[f"{node.name} fsyncs/{unit}"] = (syncs_after - syncs) / count


async def run(
    dsn: str,
    create: Callable[[asyncpg.Connection, str], Awaitable[None]],
    *,
    clients: int,
    creates: int,
    merchants: list[str],
    nodes: list[Node],
    unit: str = "create",
) -> Result:
    conns = [await asyncpg.connect(dsn) for _ in range(clients)]
    latencies: list[float] = []
    for conn in conns:  # warm: plans cached, connections to the workers open
        for _ in range(WARM):
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
    result = {f"{unit}s/s": done / elapsed, "p50 ms": statistics.median(latencies) * 1000}
    for node, seconds in zip(nodes, spent, strict=True):
        result[f"{node.name} cpu ms/{unit}"] = seconds / done * 1000
    return result


async def through_api(
    server: Server, keys: list[str], *, clients: int, creates: int, nodes: list[Node]
) -> Result:
    """Creates over HTTP, ``clients`` at a time, for random merchants (their API keys)."""
    latencies: list[float] = []
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(server.url, timeout=timeout) as http:

        async def one() -> None:
            started = time.perf_counter()
            headers = {
                "Authorization": f"Bearer {random.choice(keys)}",
                "Idempotency-Key": str(uuid.uuid4()),
            }
            async with http.post("/v1/transactions", json=body(), headers=headers) as answer:
                assert answer.status == 201, f"{await answer.text()}\n{server.log_tail()}"
            latencies.append(time.perf_counter() - started)

        async def client(count: int) -> None:
            for _ in range(count):
                await one()

        await asyncio.gather(*(client(WARM) for _ in range(clients)))
        latencies.clear()
        before = [cpu_seconds(node) for node in nodes]
        server_before, host_before = server_cpu(server.pid)
        own_before, (busy_before, total_before) = own_cpu(), machine_ticks()
        started = time.perf_counter()
        await asyncio.gather(*(client(creates // clients) for _ in range(clients)))
        elapsed = time.perf_counter() - started
        own_spent, (busy_after, total_after) = own_cpu() - own_before, machine_ticks()
        server_after, host_after = server_cpu(server.pid)
        spent = [cpu_seconds(node) - was for node, was in zip(nodes, before, strict=True)]
    done = len(latencies)
    result = {"creates/s": done / elapsed, "p50 ms": statistics.median(latencies) * 1000}
    for node, seconds in zip(nodes, spent, strict=True):
        result[f"{node.name} cpu ms/create"] = seconds / done * 1000
    ticks = os.sysconf("SC_CLK_TCK")
    result["server cpu ms/create"] = (server_after - server_before) / done * 1000
    result["acquirer cpu ms/create"] = (host_after - host_before) / done * 1000
    result["generator cpu ms/create"] = own_spent / done * 1000
    result["machine busy ms/create"] = (busy_after - busy_before) / ticks / done * 1000
    result["machine busy"] = (busy_after - busy_before) / max(1, total_after - total_before)
    return result


def show(name: str, result: Result) -> None:
    print(f"{name:44} " + "  ".join(f"{k} {v:,.2f}" for k, v in result.items()), flush=True)


def api_runs(
    cluster: CitusCluster, databases: dict[str, str], root: Path, args: argparse.Namespace
) -> dict[str, Result]:
    results: dict[str, Result] = {}
    for name, database in databases.items():
        folder = root / database
        folder.mkdir(parents=True, exist_ok=True)
        backend = Backend("measure", cluster.url(database), folder)
        server = backend.server(IDEMPAY_DB_POOL_SIZE=str(args.clients))
        nodes = list(cluster.nodes.values()) if "Citus" in name else [cluster.coordinator]
        try:
            keys = [backend.api_key(f"measure-{n:03d}") for n in range(args.merchants)]
            before = counters(nodes, database)
            results[name] = asyncio.run(
                through_api(server, keys, clients=args.clients, creates=args.creates, nodes=nodes)
            )
        finally:
            backend.stop_all()
        done = args.creates // args.clients * args.clients + WARM * args.clients
        commits(results[name], nodes, database, before, done)
        show(name, results[name])
    return results


def workers_cpu(result: Result, unit: str = "create") -> float:
    return sum(
        v for k, v in result.items() if k.startswith("worker") and k.endswith(f"cpu ms/{unit}")
    )


def floor(results: dict[str, Result]) -> None:
    """The bound the same run's CPU figures put on Citus ÷ plain through the API, were the
    create the two delegated calls (``--floor``): with the machine's cores the limit, both
    servers spend their cores on the same work but for the database's part."""
    plain, citus = results["plain Postgres, API"], results["Citus, API"]
    ideal, event = results["Citus, claim+finish (delegated)"], results["Citus, request event"]
    noop = results["Citus, no-op call (delegated)"]
    s, a = plain["server cpu ms/create"], plain["acquirer cpu ms/create"]
    g, p = plain["generator cpu ms/create"], plain["coordinator cpu ms/create"]
    c, w = ideal["coordinator cpu ms/create"], workers_cpu(ideal)
    e = event["coordinator cpu ms/event"] + workers_cpu(event, "event")
    cores = os.cpu_count() or 1

    def accounted(result: Result) -> float:
        return sum(v for k, v in result.items() if k.endswith("cpu ms/create"))

    measured = citus["creates/s"] / plain["creates/s"]
    bound = (s + a + p) / (s + a + c + w)
    print(
        f"\nfloor: S server {s:.2f}, A acquirer host {a:.2f}, P plain Postgres {p:.2f} ms/create"
        f" (plain API row; its load generator G {g:.2f}); Citus API row: server "
        f"{citus['server cpu ms/create']:.2f}, acquirer {citus['acquirer cpu ms/create']:.2f}"
    )
    print(
        f"ideal delegated claim+finish: C {c:.2f} + W {w:.2f} = {c + w:.2f} ms/create"
        f" (no-op call: {noop['coordinator cpu ms/call']:.2f} + {workers_cpu(noop, 'call'):.2f}"
        f" ms/call); request event as one routed insert E {e:.2f} ms"
    )
    for name, result in (("plain", plain), ("Citus", citus)):
        busy = result["machine busy"]
        print(
            f"machine during the {name} API row: {busy:.0%} busy of {cores} cores"
            f" ({result['machine busy ms/create']:.2f} ms/create all processes,"
            f" {result['machine busy ms/create'] - accounted(result):.2f} outside the"
            " nodes, server, host and generator); server at"
            f" {result['server cpu ms/create'] * result['creates/s'] / 1000:.2f} of a core"
            + ("" if busy >= 0.9 else " — not CPU-bound: the bound below does not hold as such")
        )
    print(
        f"bound (S+A+P)/(S+A+C+W) = {bound:.2f}; with the event E in the denominator"
        f" {(s + a + p) / (s + a + c + w + e):.2f}; with G on both sides"
        f" {(s + a + p + g) / (s + a + c + w + g):.2f}; measured {measured:.2f}"
    )
    # Whether or not the rows were CPU-bound: the ideal create's CPU ceiling on this machine
    # — all of the plain row's busy CPU per create (kernel, other processes included), its
    # database part P swapped for the ideal calls' C + W, on every core; and one core for the
    # one server process — beside the plain row's measured rate. Assumes the rest of a create
    # costs on Citus at least what it costs on plain Postgres.
    everything = plain["machine busy ms/create"]
    ceilings = []
    for label, extra in (("", 0.0), (" + E", e)):
        ceiling = min(cores / (everything - p + c + w + extra), 1 / s) * 1000
        ceilings.append(ceiling / plain["creates/s"])
        print(
            f"CPU ceiling min({cores} cores / (M {everything:.2f} - P + C + W{label}), 1 core / S)"
            f" = {ceiling:,.0f} creates/s = {ceiling / plain['creates/s']:.2f}x the plain row's"
            f" {plain['creates/s']:,.0f}"
        )

    def per_create(result: Result, what: str) -> str:
        coordinator = result.get(f"coordinator {what}/create", 0.0)
        workers = sum(v for k, v in result.items() if k.startswith("worker") and what in k)
        return f"{coordinator:.2f} + {workers:.2f}"

    print(
        "transactions / WAL fsyncs per create, coordinator + workers: plain API"
        f" {per_create(plain, 'xacts')} / {per_create(plain, 'fsyncs')}; Citus API"
        f" {per_create(citus, 'xacts')} / {per_create(citus, 'fsyncs')}; ideal delegated"
        f" {per_create(ideal, 'xacts')} / {per_create(ideal, 'fsyncs')}"
    )
    print(
        "0.8 within the CPU bounds of the ideal delegated path: (S+A+P)/(S+A+C+W) "
        f"{'yes' if bound >= 0.8 else 'no'},"
        f" machine ceiling {'yes' if ceilings[0] >= 0.8 else 'no'}"
    )


def prepare_floor(citus_dsn: str, plain_dsn: str, merchant: str) -> None:
    """The floor's functions on both databases, distributed on Citus; each call checked to
    be delegated (EXPLAIN: one task, on the worker holding the merchant's shard)."""
    for signature, definition in FLOOR_FUNCTIONS.items():
        asyncio.run(execute(plain_dsn, definition))
        asyncio.run(execute(citus_dsn, definition))
        asyncio.run(
            execute(
                citus_dsn,
                f"SELECT create_distributed_function('{signature}', 'm', "
                "colocate_with := 'idempotency_key')",
            )
        )

    async def explain() -> None:
        conn = await asyncpg.connect(citus_dsn)
        try:
            for name, call in EXPLAINED.items():
                plan = "\n".join(
                    row[0] for row in await conn.fetch(f"EXPLAIN {call.format(m=merchant)}")
                )
                assert "Citus" in plan and "Task Count: 1" in plan, f"{name} not delegated:\n{plan}"
        finally:
            await conn.close()

    asyncio.run(explain())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--creates", type=int, default=2000)
    parser.add_argument("--merchants", type=int, default=32)
    parser.add_argument("--api", action="store_true", help="also through idempay serve")
    parser.add_argument(
        "--floor", action="store_true", help="also the create as two delegated calls (the bound)"
    )
    args = parser.parse_args()
    if args.floor and not args.api:
        parser.error("--floor needs --api (the bound takes the API rows' CPU)")
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
        coordinator = [cluster.coordinator]
        runs: dict[str, tuple[str, Callable[[asyncpg.Connection, str], Awaitable[None]], str]] = {
            "plain Postgres, tx": (plain_dsn, create_tx, "create"),
            "plain Postgres, fn": (plain_dsn, create_fn, "create"),
            "Citus, tx (routed statements)": (citus_dsn, create_tx, "create"),
            "Citus, fn (delegated call)": (citus_dsn, create_fn, "create"),
        }
        if args.floor:
            prepare_floor(citus_dsn, plain_dsn, merchants[0])
            runs |= {
                "plain Postgres, claim+finish (2 fn calls)": (plain_dsn, create_floor, "create"),
                "Citus, claim+finish (delegated)": (citus_dsn, create_floor, "create"),
                "plain Postgres, no-op call": (plain_dsn, call_noop, "call"),
                "Citus, no-op call (delegated)": (citus_dsn, call_noop, "call"),
                "plain Postgres, request event": (plain_dsn, write_event, "event"),
                "Citus, request event": (citus_dsn, write_event, "event"),
            }
        print(f"{args.clients} clients, {args.creates} creates, {args.merchants} merchants")
        results: dict[str, Result] = {}
        for name, (dsn, create, unit) in runs.items():
            database = citus_db if dsn == citus_dsn else plain_db
            measured = nodes if dsn == citus_dsn else coordinator
            before = counters(measured, database)
            results[name] = asyncio.run(
                run(
                    dsn,
                    create,
                    clients=args.clients,
                    creates=args.creates,
                    merchants=merchants,
                    nodes=measured,
                    unit=unit,
                )
            )
            done = args.creates // args.clients * args.clients + WARM * args.clients
            commits(results[name], measured, database, before, done)
            show(name, results[name])
        if args.api:
            databases = {"plain Postgres, API": plain_db, "Citus, API": citus_db}
            results |= api_runs(cluster, databases, root, args)
        if args.floor:
            floor(results)
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
