# ruff: noqa: T201, E501
"""Prototype (not wired into the app): the inline create's storage work as ONE statement.

    python -m loadtest.prototypes.fastpath_pg [--rounds 3] [--seconds 4] [--concurrency 50]

Side by side in one process, alternating rounds, 50 tasks in a closed loop, no HTTP:
- ``live``: ``TransactionService.create`` as the app runs it (SQLAlchemy Core on asyncpg:
  autocommit key read, BEGIN, issuer, key, transaction, ledger, outbox inserts, COMMIT —
  8 round trips);
- ``cte``: the same rows from one data-modifying-CTE statement, an asyncpg prepared
  statement on a pool of the same size, autocommit (one statement is one transaction,
  ``synchronous_commit`` on): 1 round trip. The key insert decides: on a conflict ``k``
  returns no row and nothing else is inserted; the caller then reads the existing key (the
  rare path). The Python before the SQL (rendering the body, hashes) is the same code.

Reports creates/s and this process's CPU µs per create (``time.process_time``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid

import asyncpg

from api.config import Settings
from api.db import utcnow
from api.idempotency.keys import body_fingerprint
from api.main import build_context
from api.transactions import repository
from api.transactions.issuer import _decide
from api.transactions.schemas import TransactionCreate
from loadtest._bench_env import create_database, database_url, drop_database, prepare_database

CREATE_SQL = """
WITH k AS (
  INSERT INTO idempotency_key (merchant_id, key, state, fingerprint, lease_token,
    terminal_id, response_status, response_body, created_at, updated_at)
  VALUES ($1, $2, 'completed', $3, 1, $4, 201, $5, $6, $6)
  ON CONFLICT DO NOTHING RETURNING key
), i AS (
  INSERT INTO issuer_authorization (issuer_key, result, decline_reason, authorization_code,
    amount, currency, calls, created_at)
  SELECT $7, $8, $9, $10, $11, $12, 1, $6 FROM k
), t AS (
  INSERT INTO "transaction" (merchant_id, id, terminal_id, type, amount, currency, card_last4,
    card_brand, card_fingerprint, installments, status, decline_reason, authorization_code,
    captured_at, created_at, processed_at, metadata)
  SELECT $1, $2, $4, $13, $11, $12, $14, $15, $16, $17, $8, $9, $10, $18, $6, $19, $20 FROM k
  RETURNING id
), l AS (
  INSERT INTO ledger_entry (entry_id, merchant_id, transaction_id, amount, currency, kind,
    created_at)
  SELECT $21, $1, t.id, $22, $12, $23, $19 FROM t WHERE $8 = 'approved'
), o AS (
  INSERT INTO outbox_event (event_id, merchant_id, type, transaction_id, payload, created_at)
  SELECT $24, $1, 'transaction.completed', t.id, $25, $19 FROM t
)
SELECT count(*) FROM k
"""

BODY = {
    "terminal_id": "T-0001",
    "amount": 1250,
    "currency": "BRL",
    "card": {"token": "tok_visa_4242", "last4": "4242", "brand": "visa"},
}


class Cte:
    def __init__(self, pool: asyncpg.Pool, service: object) -> None:
        self.pool = pool
        self.service = service

    async def create(self, merchant_id: str, key: str, body: TransactionCreate, fp: str) -> bool:
        service = self.service
        issuer_key = service.issuer_key(merchant_id, key)  # type: ignore[attr-defined]
        auth = _decide(issuer_key, body.card.token)
        now = utcnow()
        txn = service.new_transaction(merchant_id, key, body, auth, created_at=now)  # type: ignore[attr-defined]
        text = repository.render(txn)
        event_id = str(uuid.uuid4())
        payload = json.dumps(
            {
                "event_id": event_id,
                "type": "transaction.completed",
                "merchant_id": merchant_id,
                "transaction_id": key,
                "occurred_at": repository.iso(txn.processed_at),
                "data": repository.body_of(txn),
            },
            separators=(",", ":"),
        )
        kind, signed = ("refund", -txn.amount) if txn.type == "refund" else ("charge", txn.amount)
        async with self.pool.acquire() as conn:
            inserted = await conn.fetchval(
                CREATE_SQL,
                merchant_id, key, fp, txn.terminal_id, text, now,
                issuer_key, txn.status, txn.decline_reason, txn.authorization_code,
                txn.amount, txn.currency, txn.type, txn.card_last4, txn.card_brand,
                txn.card_fingerprint, txn.installments, txn.captured_at, txn.processed_at,
                txn.metadata_json, str(uuid.uuid4()), signed, kind, event_id, payload,
            )  # fmt: skip
        return bool(inserted)


async def _drive(create, merchant_id: str, seconds: float, concurrency: int) -> tuple[int, float]:  # type: ignore[no-untyped-def]
    body = TransactionCreate.model_validate(BODY)
    fp = body_fingerprint(body)
    done = 0
    deadline = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            await create(merchant_id, str(uuid.uuid4()), body, fp)
            done += 1

    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done, (time.process_time() - cpu), time.perf_counter() - wall  # type: ignore[return-value]


async def _main(args: argparse.Namespace, database: str, merchant_id: str) -> None:
    settings = Settings(database_url=database_url(database))
    ctx = build_context(settings)
    pool = await asyncpg.create_pool(
        database_url(database).replace("+asyncpg", ""), min_size=30, max_size=30
    )
    variants = {"live": ctx.service.create, "cte": Cte(pool, ctx.service).create}
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    for create in variants.values():  # warm-up: prepared statements, caches
        await _drive(create, merchant_id, 1.0, args.concurrency)
    for number in range(args.rounds):
        order = list(variants) if number % 2 == 0 else list(variants)[::-1]
        for name in order:
            done, cpu, wall = await _drive(
                variants[name], merchant_id, args.seconds, args.concurrency
            )  # type: ignore[misc]
            results[name].append((done / wall, 1e6 * cpu / done))
            print(
                f"round {number + 1} {name:<5} {done / wall:8,.0f}/s  {1e6 * cpu / done:7,.0f} CPU µs/create"
            )
    for name, rows in results.items():
        print(
            f"{name:<5} median {statistics.median(r[0] for r in rows):8,.0f}/s  {statistics.median(r[1] for r in rows):7,.0f} CPU µs/create"
        )
    paired = [c[0] / live[0] for c, live in zip(results["cte"], results["live"], strict=True)]
    cpu = [c[1] / live[1] for c, live in zip(results["cte"], results["live"], strict=True)]
    print(
        f"cte ÷ live: rate {statistics.median(paired):.2f} (per round {min(paired):.2f}–{max(paired):.2f}), CPU per create {statistics.median(cpu):.2f}"
    )
    counts = await pool.fetchrow(
        "SELECT (SELECT count(*) FROM idempotency_key) AS keys,"
        " (SELECT count(*) FROM issuer_authorization) AS issuer,"
        ' (SELECT count(*) FROM "transaction") AS txns,'
        " (SELECT count(*) FROM ledger_entry) AS ledger,"
        " (SELECT count(*) FROM outbox_event) AS outbox"
    )
    print("rows (must all be equal):", dict(counts))
    await pool.close()
    await ctx.engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--concurrency", type=int, default=50)
    args = parser.parse_args()
    database = create_database()
    try:
        prepare_database(database)
        merchant_id = asyncio.run(_merchant(database))
        import uvloop

        uvloop.run(_main(args, database, merchant_id))
    finally:
        drop_database(database)


async def _merchant(database: str) -> str:
    conn = await asyncpg.connect(database_url(database).replace("+asyncpg", ""))
    try:
        return str(await conn.fetchval("SELECT id FROM merchant LIMIT 1"))
    finally:
        await conn.close()


if __name__ == "__main__":
    main()
