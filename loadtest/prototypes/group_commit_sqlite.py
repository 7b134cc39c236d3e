# ruff: noqa: T201, E501
"""Prototype (not wired into the app): SQLite creates through ONE writer thread with group
commit, side by side with ``TransactionService.create`` on the embedded default.

    python -m loadtest.prototypes.group_commit_sqlite [--rounds 3] [--seconds 4]

- ``live``: the app's path (aiosqlite, a ``BEGIN IMMEDIATE`` transaction per create plus
  the autocommit-less key read — 28 hops to aiosqlite's thread per create);
- ``group``: requests put (rows, future) on a queue; one thread with its own ``sqlite3``
  connection (WAL, ``synchronous=FULL``) takes everything queued (up to 256), runs
  ``BEGIN IMMEDIATE``, each create inside its own SAVEPOINT (the key insert decides: on a
  conflict that create inserts nothing and is answered "taken"), one ``COMMIT`` — one fsync
  for the batch — and only then resolves the batch's futures. No answer before its commit is
  durable; key + issuer + transaction + ledger + outbox still commit together per create.

Reports creates/s, this process's CPU µs per create and the mean batch size.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import queue
import sqlite3
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from api.config import Settings
from api.db import utcnow
from api.idempotency.keys import body_fingerprint
from api.main import build_context
from api.transactions import repository
from api.transactions.issuer import _decide
from api.transactions.schemas import TransactionCreate
from loadtest import _bench_peers as peers

BODY = {
    "terminal_id": "T-0001",
    "amount": 1250,
    "currency": "BRL",
    "card": {"token": "tok_visa_4242", "last4": "4242", "brand": "visa"},
}
_KEY = (
    "INSERT INTO idempotency_key (merchant_id, key, state, fingerprint, lease_token, terminal_id,"
    " response_status, response_body, created_at, updated_at)"
    " VALUES (?, ?, 'completed', ?, 1, ?, 201, ?, ?, ?) ON CONFLICT DO NOTHING"
)
_ISSUER = (
    "INSERT INTO issuer_authorization (issuer_key, result, decline_reason, authorization_code,"
    " amount, currency, calls, created_at) VALUES (?, ?, ?, ?, ?, ?, 1, ?)"
)
_TXN = (
    'INSERT INTO "transaction" (merchant_id, id, terminal_id, type, amount, currency, card_last4,'
    " card_brand, card_fingerprint, installments, status, decline_reason, authorization_code,"
    " captured_at, created_at, processed_at, metadata)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_LEDGER = (
    "INSERT INTO ledger_entry (entry_id, merchant_id, transaction_id, amount, currency, kind,"
    " created_at) VALUES (?, ?, ?, ?, ?, ?, ?)"
)
_OUTBOX = (
    "INSERT INTO outbox_event (event_id, merchant_id, type, transaction_id, payload, created_at)"
    " VALUES (?, ?, 'transaction.completed', ?, ?, ?)"
)


def _ts(moment: Any) -> str | None:
    return None if moment is None else moment.replace(tzinfo=None).isoformat(sep=" ")


class GroupWriter:
    def __init__(self, path: Path, *, max_batch: int = 256) -> None:
        self.path = path
        self.max_batch = max_batch
        self.queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.batches: list[int] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.execute("PRAGMA foreign_keys=ON")
        while True:
            first = self.queue.get()
            if first is None:
                return
            batch = [first]
            while len(batch) < self.max_batch:
                try:
                    batch.append(self.queue.get_nowait())
                except queue.Empty:
                    break
            answers = []
            db.execute("BEGIN IMMEDIATE")
            for rows, _loop, _future in batch:
                db.execute("SAVEPOINT c")
                won = db.execute(_KEY, rows[0]).rowcount == 1
                if won:
                    for sql, params in zip(
                        (_ISSUER, _TXN, _LEDGER, _OUTBOX), rows[1:], strict=True
                    ):
                        if params is not None:
                            db.execute(sql, params)
                db.execute("RELEASE c")
                answers.append(won)
            db.execute("COMMIT")  # synchronous=FULL: durable before anyone is answered
            self.batches.append(len(batch))
            for (_rows, loop, future), won in zip(batch, answers, strict=True):
                loop.call_soon_threadsafe(future.set_result, won)

    async def create(self, merchant_id: str, key: str, body: TransactionCreate, fp: str) -> bool:
        issuer_key = self.service.issuer_key(merchant_id, key)
        auth = _decide(issuer_key, body.card.token)
        now = utcnow()
        txn = self.service.new_transaction(merchant_id, key, body, auth, created_at=now)
        text = repository.render(txn)
        event_id = str(uuid.uuid4())
        payload = json.dumps(
            {"event_id": event_id, "type": "transaction.completed", "merchant_id": merchant_id,
             "transaction_id": key, "occurred_at": repository.iso(txn.processed_at),
             "data": repository.body_of(txn)},
            separators=(",", ":"),
        )  # fmt: skip
        n, p = _ts(now), _ts(txn.processed_at)
        kind, signed = ("refund", -txn.amount) if txn.type == "refund" else ("charge", txn.amount)
        rows = (
            (merchant_id, key, fp, txn.terminal_id, text, n, n),
            (issuer_key, txn.status, txn.decline_reason, txn.authorization_code, txn.amount,
             txn.currency, n),
            (merchant_id, key, txn.terminal_id, txn.type, txn.amount, txn.currency,
             txn.card_last4, txn.card_brand, txn.card_fingerprint, txn.installments, txn.status,
             txn.decline_reason, txn.authorization_code, _ts(txn.captured_at), n, p,
             txn.metadata_json),
            (str(uuid.uuid4()), merchant_id, key, signed, txn.currency, kind, p)
            if txn.status == "approved" else None,
            (event_id, merchant_id, key, payload, p),
        )  # fmt: skip
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.queue.put((rows, loop, future))
        return bool(await future)


async def _drive(create: Any, merchant_id: str, seconds: float, concurrency: int) -> Any:
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
    return done, time.process_time() - cpu, time.perf_counter() - wall


async def _main(args: argparse.Namespace, path: Path) -> None:
    ctx = build_context(Settings(database_url=peers.sqlite_url(path)))
    db = sqlite3.connect(path)
    merchant_id = db.execute("SELECT id FROM merchant LIMIT 1").fetchone()[0]
    db.close()
    writer = GroupWriter(path)
    writer.service = ctx.service  # type: ignore[attr-defined]
    variants = {"live": ctx.service.create, "group": writer.create}
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    for create in variants.values():
        await _drive(create, merchant_id, 1.0, args.concurrency)
    for number in range(args.rounds):
        order = list(variants) if number % 2 == 0 else list(variants)[::-1]
        for name in order:
            done, cpu, wall = await _drive(
                variants[name], merchant_id, args.seconds, args.concurrency
            )
            results[name].append((done / wall, 1e6 * cpu / done))
            print(
                f"round {number + 1} {name:<5} {done / wall:8,.0f}/s  {1e6 * cpu / done:7,.0f} CPU µs/create"
            )
    for name, rows in results.items():
        print(
            f"{name:<5} median {statistics.median(r[0] for r in rows):8,.0f}/s  {statistics.median(r[1] for r in rows):7,.0f} CPU µs/create"
        )
    paired = [g[0] / live[0] for g, live in zip(results["group"], results["live"], strict=True)]
    print(
        f"group ÷ live: rate {statistics.median(paired):.2f} (per round {min(paired):.2f}–{max(paired):.2f}); mean batch {statistics.mean(writer.batches):.1f}"
    )
    writer.queue.put(None)
    db = sqlite3.connect(path)
    counts = [db.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in
              ("idempotency_key", "issuer_authorization", '"transaction"', "ledger_entry", "outbox_event")]  # fmt: skip
    print("rows (must all be equal):", counts)
    await ctx.engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--concurrency", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="idempay-gc-") as tmp:
        path = Path(tmp) / "idempay.db"
        peers.prepare_sqlite(path)
        import uvloop

        uvloop.run(_main(args, path))


if __name__ == "__main__":
    main()
