"""The SQLite writer thread's own cost per create, in process (no HTTP, no event loop).

    python -m loadtest.bench_sqlite_writer [--batch 50] [--batches 200] [--repeat 5]

A fresh migrated SQLite file (``_bench_peers.prepare_sqlite``); batches of ``--batch``
creates — each the statements ``sqlite_create.statements`` builds for an approved purchase
(key, issuer record, transaction, ledger entry, outbox event) — and one flush of request
events per batch, written by ``sqlite_create._write_batch`` (the writer thread's function)
on a ``sqlite_create.connect`` connection. Per create: the thread's CPU (``thread_time``) and
wall time (the statements and the COMMIT's fsync). The medians of
``--repeat`` runs are printed. This is the part of the SQLite create that holds the write
lock; the event loop's part is measured through HTTP (``bench_ab --backend sqlite``).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from api.transactions import sqlite_create as sc
from loadtest import _bench_peers as peers
from loadtest._bench_env import say


def _create(merchant: str, n: int) -> sc.Statements:
    now = sc.stored(datetime.now(UTC))
    key = str(uuid.uuid4())
    body = '{"id":"' + key + '","status":"approved","amount":1250}'
    return [
        (sc._KEY, (merchant, key, "f" * 64, f"T-{n % 50:04d}", body, now, now)),
        (sc._ISSUER, (merchant, "i" + key, "approved", None, "A1B2C3", 1250, "BRL", now)),
        (sc._TXN, (merchant, key, f"T-{n % 50:04d}", "purchase", 1250, "BRL", "4242", "visa",
                   "c" * 64, 1, "approved", None, "A1B2C3", None, now, now, None, 0)),
        (sc._LEDGER, (str(uuid.uuid4()), merchant, key, 1250, "BRL", "sale", now)),
        (sc._OUTBOX, (str(uuid.uuid4()), merchant, "transaction.completed", key,
                      '{"data":' + body + "}", now)),
    ]  # fmt: skip


def _events(merchant: str, count: int) -> sc.EventRows:
    now = datetime.now(UTC)
    return sc.EventRows(
        [
            (str(uuid.uuid4()), now, merchant, "T-0001", str(uuid.uuid4()),
             "POST /v1/transactions", "created", 201, 1, None, 3.2)
            for _ in range(count)
        ]
    )  # fmt: skip


def run(path: Path, merchant: str, batch: int, batches: int) -> dict[str, float]:
    db = sc.connect(str(path))
    cpu = wall = 0.0
    n = 0
    try:
        for _ in range(batches):
            jobs: list[Any] = [_create(merchant, n + i) for i in range(batch)]
            jobs.append(_events(merchant, batch))
            n += batch
            c0, w0 = time.thread_time(), time.perf_counter()
            results = sc._write_batch(db, jobs)
            cpu += time.thread_time() - c0
            wall += time.perf_counter() - w0
            assert all(result is True for result in results), results[:3]
    finally:
        db.close()
    return {"cpu_us": 1e6 * cpu / n, "wall_us": 1e6 * wall / n}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench_sqlite_writer")
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    figures = []
    with tempfile.TemporaryDirectory(prefix="idempay-sqlite-writer-") as tmp:
        path = Path(tmp) / "idempay.db"
        peers.prepare_sqlite(path)
        db = sc.connect(str(path))
        merchant = db.execute("SELECT id FROM merchant").fetchone()[0]
        db.close()
        for _ in range(args.repeat):
            figures.append(run(path, merchant, args.batch, args.batches))
            say(
                f"writer: {figures[-1]['cpu_us']:6.1f} µs CPU, "
                f"{figures[-1]['wall_us']:6.1f} µs wall per create"
            )
    cpu = statistics.median(f["cpu_us"] for f in figures)
    wall = statistics.median(f["wall_us"] for f in figures)
    say(f"median: {cpu:.1f} µs CPU, {wall:.1f} µs wall per create (batch {args.batch})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
