"""Postgres group commit for the one-write create, side by side with today's create.

    python -m loadtest.bench_group_commit [--rounds 6] [--seconds 5] [--concurrency 50]
                                          [--pool 22] [--writers 1,2,4] [--cap 64]

Measured before group commit was wired into the server (940a6ab); ``B`` now runs the server's
own batcher and statement (api/transactions/pg_group.py: ``GroupCommit``, ``CREATE_MANY``,
the same writers with K given here). On a private database of the shared Postgres
(migrated with the real schema, dropped at the end), 50 asyncio tasks in a closed loop each
build a create's rows with the app's own ``api.transactions.inline.build`` (fresh uuid4 keys,
merchant ``bench``, one in ten declined: no ledger entry) and write them:

- ``A``: today's create, ``PgInline.create`` (``pg_create.CREATE``: one prepared statement in
  autocommit per create, on an ``api.db.DriverPool`` of ``--pool`` connections);
- ``B<K>``: group commit — the create is queued, and K writer tasks each take everything
  queued (at most ``--cap``; a key already in the batch, or in a batch in flight, waits for
  the next one) and send it
  as ONE statement, ``CREATE_MANY`` (the same CTE shape over ``unnest`` arrays, the key rows
  inserted in sorted (merchant, key) order, ``ON CONFLICT DO NOTHING``), in autocommit with
  ``synchronous_commit`` on; each create is answered from its row of the result only after
  that statement (its commit) returned. A batch statement failing with anything but a
  storage error falls back to one ``PgInline.create`` per create; a storage error fails the
  whole batch (the server would answer 503 to each).

Rounds alternate (A B1 B2 B4, then B4 B2 B1 A, …); ``ANALYZE`` runs before every segment
(the shared Postgres runs with autovacuum off). Per segment: creates/s, p50/p99 of the
storage call (queue wait included for B), CPU per create of the shared server's processes
working for the bench database (``postgres_cpu``: its backends plus the shared WAL writer,
checkpointer and background writer — an upper bound on a shared server), this process's CPU
per create (``time.process_time``: building the rows included, the same in A and B, and the
wait sampler's thread), the cluster's WAL flushes and bytes
per create (``pg_stat_wal``, cluster-wide, reported by backends about once a second) and the
mean batch. Then the medians of the per-round ratios B ÷ A, with their ranges.

Checks, after the rounds: a batch holding a key that exists answers that key's row and writes
nothing for it; a key twice in one moment goes to the next batch (answered the first one's
row); a batch statement error falls back to one statement per create; two batches of the same
keys in opposite orders do not deadlock (and, as a control, do without the sort); finally
every key has exactly one transaction, issuer record and outbox row, and an approved one
exactly one ledger entry (a declined one none), and the key count is what was answered.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import os
import statistics
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg

from api.config import Settings
from api.db import DriverPool, create_engine, utcnow
from api.idempotency.keys import body_fingerprint
from api.idempotency.store import KeyRecord
from api.transactions import inline
from api.transactions.guard import DuplicateOf
from api.transactions.inline import InlineCreate
from api.transactions.issuer import SimulatedIssuer
from api.transactions.pg_create import PgInline
from api.transactions.pg_group import (
    CREATE_MANY,
    LOCK_WAIT,
    Answer,
    GroupCommit,
    answers,
    columns,
    create_args,
)
from api.transactions.schemas import TransactionCreate
from api.transactions.service import TransactionService
from loadtest._bench_env import (
    create_database,
    database_url,
    drop_database,
    free_connection_slots,
    prepare_database,
    say,
)
from loadtest._bench_waits import WaitSampler

MERCHANT = "bench"
CARD = {"token": "tok_visa_4242", "last4": "4242", "brand": "visa"}
BODY = {"terminal_id": "T-0001", "amount": 1250, "currency": "BRL", "card": CARD}
DECLINED = {**BODY, "card": {**CARD, "token": "tok_decline_do_not_honor"}}

UNSORTED = CREATE_MANY.replace(  # the control
    "FROM u CROSS JOIN lw ORDER BY merchant_id, key", "FROM u CROSS JOIN lw"
)
assert UNSORTED != CREATE_MANY

WAL = "SELECT wal_sync, wal_write, wal_bytes::float8 FROM pg_stat_wal"


class Measured(GroupCommit):
    """The server's batcher (``api.transactions.pg_group.GroupCommit``), recording the size
    of every batch it sends (``sizes``)."""

    def __init__(self, pool: DriverPool, single: PgInline, writers: int, cap: int) -> None:
        super().__init__(pool, single.create, writers=writers, cap=cap)
        self.sizes: list[int] = []

    async def _send(self, batch: list[Any]) -> None:
        self.sizes.append(len(batch))
        await super()._send(batch)


_TICK = os.sysconf("SC_CLK_TCK")


def postgres_cpu(postmaster: int, database: str) -> float:
    """CPU seconds (user + system, own time only) of the shared server's processes working
    for the bench database: its backends and the server's auxiliaries (WAL writer,
    checkpointer, background writer). ``_bench_env.sample_cpu``'s rule, narrowed to the
    children of the shared postmaster and without the postmaster's reaped-children time: on
    this machine other sessions' tests start and stop private Postgres clusters (also
    ``postgres`` processes) and open and close connections to the shared one, which moved
    that figure by more than the creates' own CPU (once below zero). The bench's backends
    live through every segment, so nothing of ours is reaped in one."""
    total = 0.0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            raw = Path(entry.path, "stat").read_text()
            cmdline = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        fields = raw[raw.rindex(")") + 2 :].split()
        if int(fields[1]) != postmaster:  # ppid
            continue
        backend = "127.0.0.1(" in cmdline or "[local]" in cmdline or "::1(" in cmdline
        worker = "parallel worker" in cmdline or "autovacuum worker" in cmdline
        if backend and f" {database} " not in cmdline or worker:
            continue
        total += (int(fields[11]) + int(fields[12])) / _TICK  # utime stime
    return total


def parent_of(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[1])


def single_writer(pool: DriverPool) -> PgInline:
    """Today's create (``PgInline``) on plain Postgres, whichever constructor the tree has
    (``PgInline(pool)`` asking for Citus on the first create, or ``PgInline(pool,
    citus=…)``): the bench database has no Citus (``Bench.run`` checks)."""
    make: Any = PgInline
    if "citus" in inspect.signature(PgInline).parameters:
        single: PgInline = make(pool, citus=False)
    else:
        single = make(pool)
    single.citus = False
    return single


@dataclass
class Segment:
    variant: str
    creates: int
    wall: float
    latencies: list[float]
    postgres_s: float
    harness_s: float
    wal_sync: float
    wal_bytes: float
    batches: list[int]

    @property
    def rate(self) -> float:
        return self.creates / self.wall

    def quantile(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    @property
    def pg_us(self) -> float:
        return 1e6 * self.postgres_s / self.creates

    @property
    def harness_us(self) -> float:
        return 1e6 * self.harness_s / self.creates


class Bench:
    def __init__(self, database: str, args: argparse.Namespace) -> None:
        self.database = database
        self.args = args
        settings = Settings(database_url=database_url(database))
        self.engine = create_engine(settings, pool_size=1)  # the service wants one; unused
        self.service = TransactionService(
            self.engine, SimulatedIssuer(self.engine, slow_seconds=0), settings
        )
        self.pool = DriverPool(settings.resolved_database_url, args.pool, timeout=10)
        self.single = single_writer(self.pool)
        approved = TransactionCreate.model_validate(BODY)
        declined = TransactionCreate.model_validate(DECLINED)
        self.bodies = [
            (approved, body_fingerprint(approved)),
            (declined, body_fingerprint(declined)),
        ]
        self.dsn = database_url(database).replace("+asyncpg", "")
        self.answered = 0  # creates answered True, all variants and checks
        self.waits = WaitSampler(self.dsn, database) if args.waits else None
        self.postmaster = 0  # the shared server's postmaster (``run``)

    def rows(self, key: str | None = None, n: int = 0, amount: int | None = None) -> InlineCreate:
        body, fingerprint = self.bodies[1 if n % 10 == 9 else 0]
        if amount is not None:
            body = body.model_copy(update={"amount": amount})
            fingerprint = body_fingerprint(body)
        return inline.build(
            self.service, MERCHANT, key or str(uuid.uuid4()), body, fingerprint, utcnow()
        )

    async def one(self, rows: InlineCreate) -> Answer:
        result = await self.single.create(rows)
        assert not isinstance(result, DuplicateOf)
        return result

    async def drive(
        self,
        variant: str,
        create: Callable[[InlineCreate], Awaitable[Answer]],
        seconds: float,
        admin: Any,
        group: Measured | None,
    ) -> Segment:
        await admin.execute("ANALYZE")
        latencies: list[float] = []
        done = 0
        wal0 = await admin.fetchrow(WAL)
        if group is not None:
            group.sizes.clear()
        if self.waits is not None:
            self.waits.scenario = variant
        cpu0, proc0 = postgres_cpu(self.postmaster, self.database), time.process_time()
        deadline = time.perf_counter() + seconds

        async def worker(n: int) -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                rows = self.rows(n=n)
                start = time.perf_counter()
                result = await create(rows)
                latencies.append(time.perf_counter() - start)
                assert result is True, (variant, result)
                done += 1
                n += 1

        wall = time.perf_counter()
        await asyncio.gather(*(worker(n) for n in range(self.args.concurrency)))
        wall = time.perf_counter() - wall
        proc1 = time.process_time()
        cpu1 = postgres_cpu(self.postmaster, self.database)
        if self.waits is not None:
            self.waits.scenario = None
        wal1 = await admin.fetchrow(WAL)
        self.answered += done
        return Segment(
            variant=variant,
            creates=done,
            wall=wall,
            latencies=latencies,
            postgres_s=cpu1 - cpu0,
            harness_s=proc1 - proc0,
            wal_sync=(wal1[0] - wal0[0]) / done,
            wal_bytes=(wal1[2] - wal0[2]) / done,
            batches=list(group.sizes) if group is not None else [],
        )

    async def segment(self, variant: str, seconds: float, admin: Any) -> Segment:
        if variant == "A":
            return await self.drive(variant, self.one, seconds, admin, None)
        group = Measured(self.pool, self.single, int(variant[1:]), self.args.cap)
        try:
            return await self.drive(variant, group.create, seconds, admin, group)
        finally:
            await group.close()

    async def run(self) -> None:
        admin = await asyncpg.connect(self.dsn)
        backend = await admin.fetchval("SELECT pg_backend_pid()")
        self.postmaster = parent_of(backend)
        if self.waits is not None:
            self.waits.start()
        try:
            say(
                "synchronous_commit="
                f"{await admin.fetchval('SHOW synchronous_commit')}, autovacuum="
                f"{await admin.fetchval('SHOW autovacuum')}, commit_delay="
                f"{await admin.fetchval('SHOW commit_delay')}, server "
                f"{await admin.fetchval('SHOW server_version')}"
            )
            citus = "SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')"
            assert not await admin.fetchval(citus), "CREATE_MANY is for plain Postgres"
            variants = ["A", *(f"B{k}" for k in self.args.writers)]
            for variant in variants:  # warm-up: connections, prepared statements
                await self.segment(variant, 1.0, admin)
            results: dict[str, list[Segment]] = {v: [] for v in variants}
            for number in range(self.args.rounds):
                order = variants if number % 2 == 0 else variants[::-1]
                for variant in order:
                    seg = await self.segment(variant, self.args.seconds, admin)
                    results[variant].append(seg)
                    say(_line(number + 1, seg))
            self.report(results)
            await self.checks(admin)
            await self.consistency(admin)
        finally:
            if self.waits is not None:
                self.waits.stop()
            await admin.close()
            await self.pool.close()
            await self.engine.dispose()

    def report(self, results: dict[str, list[Segment]]) -> None:
        say("\nmedians per variant")
        for variant, segs in results.items():
            batches = [b for s in segs for b in s.batches]
            batch = (
                f", batch mean {statistics.fmean(batches):.1f} median "
                f"{statistics.median(batches):.0f} max {max(batches)}"
                if batches
                else ""
            )
            say(
                f"  {variant:<3} {statistics.median(s.rate for s in segs):7,.0f}/s"
                f"  p50 {1e3 * statistics.median(s.quantile(0.5) for s in segs):6.1f} ms"
                f"  p99 {1e3 * statistics.median(s.quantile(0.99) for s in segs):6.1f} ms"
                f"  pg {statistics.median(s.pg_us for s in segs):5,.0f} µs/create"
                f"  harness {statistics.median(s.harness_us for s in segs):5,.0f} µs/create"
                f"  WAL flushes {statistics.median(s.wal_sync for s in segs):.3f}/create"
                f"  WAL {statistics.median(s.wal_bytes for s in segs):,.0f} B/create{batch}"
            )
            if self.waits is not None:
                top = ", ".join(f"{k} {v:.1f}" for k, v in self.waits.summary(variant, 5))
                say(f"      backends (mean per sample): {top}")
        say("\npaired ratios B ÷ A (median of the per-round ratios, range)")
        base = results["A"]
        for variant, segs in results.items():
            if variant == "A":
                continue
            parts = []
            figures: list[tuple[str, Callable[[Segment], float]]] = [
                ("creates/s", lambda s: s.rate),
                ("p50", lambda s: s.quantile(0.5)),
                ("p99", lambda s: s.quantile(0.99)),
                ("pg CPU/create", lambda s: s.pg_us),
                ("harness CPU/create", lambda s: s.harness_us),
                ("WAL flushes/create", lambda s: s.wal_sync),
            ]
            for name, value in figures:
                ratios = [
                    value(b) / value(a) if value(a) else float("nan")
                    for a, b in zip(base, segs, strict=True)
                ]
                parts.append(
                    f"{name} ×{statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f})"
                )
            say(f"  {variant}: " + "; ".join(parts))
            sizes = Counter(b for s in segs for b in s.batches)
            common = ", ".join(f"{size}:{count}" for size, count in sorted(sizes.items()))
            say(f"      batch sizes (size:batches): {common}")

    async def checks(self, admin: Any) -> None:
        say("\nchecks")
        # 1. A batch holding a key that exists: that key's row, nothing written for it.
        first = self.rows()
        assert await self.one(first) is True
        self.answered += 1
        key = first.txn.id
        again = self.rows(key=key, amount=999)  # another body: a different fingerprint
        fresh = [self.rows(), self.rows(n=9)]  # the second declined (no ledger row)
        conn = await self.pool.acquire()
        try:
            rows = await conn.fetch(
                CREATE_MANY,
                *columns([create_args(r, utcnow()) for r in (fresh[0], again, fresh[1])]),
                LOCK_WAIT,
            )
        finally:
            self.pool.release(conn)
        got = answers(rows, 3)
        assert got[0] is True and got[2] is True, got
        assert isinstance(got[1], KeyRecord), got
        assert got[1].fingerprint == first.fingerprint, "not the existing key's row"
        assert got[1].response_body == first.response_body
        self.answered += 2
        stored = await admin.fetchrow(
            'SELECT (SELECT count(*) FROM "transaction" WHERE merchant_id = $1 AND id = $2),'
            ' (SELECT min(amount) FROM "transaction" WHERE merchant_id = $1 AND id = $2),'
            " (SELECT count(*) FROM ledger_entry WHERE merchant_id = $1 AND transaction_id = $2),"
            " (SELECT count(*) FROM outbox_event WHERE merchant_id = $1 AND transaction_id = $2),"
            " (SELECT count(*) FROM issuer_authorization"
            "  WHERE merchant_id = $1 AND issuer_key = $3)",
            MERCHANT,
            key,
            first.issuer_key,
        )
        assert tuple(stored) == (1, 1250, 1, 1, 1), tuple(stored)
        say("  existing key in a batch: its row answered (same fingerprint), nothing written")

        # 2. The same key twice at one moment (one writer): the second waits for the next
        # batch and is answered the first one's row.
        group = Measured(self.pool, self.single, 1, self.args.cap)
        twin = self.rows()
        others = [self.rows() for _ in range(5)]
        results = await asyncio.gather(
            group.create(twin), *(group.create(r) for r in others), group.create(twin)
        )
        await group.close()
        assert results[0] is True and all(r is True for r in results[1:-1]), results
        assert isinstance(results[-1], KeyRecord), results[-1]
        assert results[-1].fingerprint == twin.fingerprint
        assert group.sizes == [6, 1], group.sizes
        self.answered += 6
        say(f"  a key twice: batches {group.sizes}, the second answered the first's row")

        # 3. A batch statement error (an issuer record left for a new key, as a purged
        # tombstone's void leaves one): one statement per create, only that one refused.
        stray = self.rows()
        await admin.execute(
            "INSERT INTO issuer_authorization (merchant_id, issuer_key, result, amount,"
            " currency, calls, created_at) VALUES ($1, $2, 'approved', 1, 'BRL', 1, now())",
            MERCHANT,
            stray.issuer_key,
        )
        group = Measured(self.pool, self.single, 1, self.args.cap)
        others = [self.rows() for _ in range(3)]
        results = await asyncio.gather(
            *(group.create(r) for r in others[:2]), group.create(stray), group.create(others[2])
        )
        await group.close()
        assert results == [True, True, False, True], results
        assert group.fallbacks == 1, group.fallbacks
        assert (
            await admin.fetchval(
                "SELECT count(*) FROM idempotency_key WHERE merchant_id = $1 AND key = $2",
                MERCHANT,
                stray.txn.id,
            )
            == 0
        )
        await admin.execute(
            "DELETE FROM issuer_authorization WHERE merchant_id = $1 AND issuer_key = $2",
            MERCHANT,
            stray.issuer_key,
        )
        self.answered += 3
        say("  batch statement error: fell back to one statement per create (3 written, 1 not)")

        # 4. Two batches of the same keys in opposite orders, at once: sorted, they wait for
        # each other; each key written once. Unsorted (the control) they can deadlock.
        for statement, tries, label in ((CREATE_MANY, 10, "sorted"), (UNSORTED, 3, "unsorted")):
            deadlocks = 0
            for _ in range(tries):
                keys = [str(uuid.uuid4()) for _ in range(self.args.cap)]
                ahead = [create_args(self.rows(key=k), utcnow()) for k in keys]
                behind = [create_args(self.rows(key=k), utcnow()) for k in reversed(keys)]
                conns = [await self.pool.acquire(), await self.pool.acquire()]
                try:
                    outcome = await asyncio.gather(
                        conns[0].fetch(statement, *columns(ahead), "10s"),  # deadlocks seen
                        conns[1].fetch(statement, *columns(behind), "10s"),
                        return_exceptions=True,
                    )
                finally:
                    for conn in conns:
                        self.pool.release(conn)
                written: Counter[str] = Counter()
                for rows_, batch in zip(outcome, (ahead, behind), strict=True):
                    if isinstance(rows_, asyncpg.DeadlockDetectedError):
                        deadlocks += 1
                        continue
                    if isinstance(rows_, BaseException):
                        raise rows_
                    for answer, args in zip(answers(rows_, len(batch)), batch, strict=True):
                        if answer is True:
                            written[args[1]] += 1
                assert sorted(written) == sorted(keys) and set(written.values()) == {1}, written
                self.answered += len(keys)
            if label == "sorted":
                assert deadlocks == 0
            say(f"  opposite orders, {label}: {tries} tries, {deadlocks} deadlocks")

    async def consistency(self, admin: Any) -> None:
        row = await admin.fetchrow(
            """
            SELECT count(*),
              count(*) FILTER (WHERE coalesce(t.n, 0) <> 1),
              count(*) FILTER (WHERE coalesce(l.n, 0) <> (t.status = 'approved')::int),
              count(*) FILTER (WHERE coalesce(o.n, 0) <> 1),
              (SELECT count(*) FROM "transaction"), (SELECT count(*) FROM ledger_entry),
              (SELECT count(*) FROM outbox_event), (SELECT count(*) FROM issuer_authorization),
              (SELECT count(*) FROM "transaction" WHERE status = 'approved')
            FROM idempotency_key AS k
            LEFT JOIN (SELECT merchant_id, id, min(status) AS status, count(*) AS n
                       FROM "transaction" GROUP BY 1, 2) AS t
              ON t.merchant_id = k.merchant_id AND t.id = k.key
            LEFT JOIN (SELECT merchant_id, transaction_id, count(*) AS n
                       FROM ledger_entry GROUP BY 1, 2) AS l
              ON l.merchant_id = k.merchant_id AND l.transaction_id = k.key
            LEFT JOIN (SELECT merchant_id, transaction_id, count(*) AS n
                       FROM outbox_event GROUP BY 1, 2) AS o
              ON o.merchant_id = k.merchant_id AND o.transaction_id = k.key
            """
        )
        keys, bad_t, bad_l, bad_o, txns, ledgers, events, issuers, approved = tuple(row)
        say(
            f"  consistency: {keys:,} keys ({self.answered:,} answered written),"
            f" {txns:,} transactions, {ledgers:,} ledger entries ({approved:,} approved),"
            f" {events:,} outbox rows, {issuers:,} issuer records;"
            f" keys without exactly one transaction {bad_t}, ledger {bad_l}, outbox {bad_o}"
        )
        assert (bad_t, bad_l, bad_o) == (0, 0, 0)
        assert keys == txns == events == issuers == self.answered
        assert ledgers == approved


def _line(number: int, seg: Segment) -> str:
    batch = f"  batch mean {statistics.fmean(seg.batches):5.1f}" if seg.batches else ""
    return (
        f"  round {number} {seg.variant:<3} {seg.rate:7,.0f}/s"
        f"  p50 {1e3 * seg.quantile(0.5):6.1f} ms  p99 {1e3 * seg.quantile(0.99):6.1f} ms"
        f"  pg {seg.pg_us:5,.0f} µs/create  harness {seg.harness_us:5,.0f} µs/create"
        f"  WAL flushes {seg.wal_sync:.3f}/create{batch}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench_group_commit")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--pool", type=int, default=22)
    parser.add_argument(
        "--writers", type=lambda s: [int(k) for k in s.split(",")], default=[1, 2, 4]
    )
    parser.add_argument("--cap", type=int, default=64)
    parser.add_argument("--no-waits", dest="waits", action="store_false")
    args = parser.parse_args()
    slots = free_connection_slots()
    need = args.pool + 3  # the pool, the admin connection, the wait sampler, create/drop
    if slots < need:
        raise SystemExit(f"Postgres has {slots} free connection slots, the bench needs {need}")
    say(
        f"load average at start: {' '.join(f'{v:.2f}' for v in os.getloadavg())};"
        f" {os.cpu_count()} CPUs; {args.rounds} rounds × {args.seconds:g} s,"
        f" {args.concurrency} in flight, pool {args.pool}, writers {args.writers}, cap {args.cap}"
    )
    database = create_database()
    try:
        prepare_database(database)
        import uvloop

        uvloop.run(Bench(database, args).run())
    finally:
        drop_database(database)
    say(f"load average at end: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
