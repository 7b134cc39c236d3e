"""What cannot be one shard on Citus, correct there (issue 18): the relay's per-merchant
numbering, the retention purge and the lake export read and write every shard, in bounded
batches, off the request path. Rows for several merchants (spread over both workers) are
written straight into a Citus database; each of the three then does on Citus what it does
on one Postgres."""

from __future__ import annotations

import asyncio
import uuid
from collections import defaultdict
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import insert

from analytics.lake import read_partition
from api.config import Settings
from api.db import create_engine
from api.events.export import export_day
from api.models import IdempotencyKey, LedgerEntry, OutboxEvent, RequestEvent, Transaction
from api.outbox.relay import number_committed
from api.retention import purge
from tests.support.backend import Backend
from tests.support.citus import CitusCluster, merchants_by_worker

MERCHANTS = [f"mer_offpath_{n:02d}" for n in range(8)]
PAYMENTS = 6  # per merchant
DAY = date(2026, 11, 20)


def _rows(merchant: str, n: int, at: datetime) -> dict[Any, list[dict[str, Any]]]:
    key = f"{merchant}-k{n}"
    transaction = {
        "merchant_id": merchant, "id": key, "terminal_id": "T-1", "type": "purchase",
        "amount": 100, "currency": "BRL", "card_last4": "4242", "card_brand": "visa",
        "card_fingerprint": "fp", "installments": 1, "status": "approved",
        "created_at": at, "processed_at": at,
    }  # fmt: skip
    return {
        IdempotencyKey: [
            {"merchant_id": merchant, "key": key, "state": "completed", "lease_token": 1,
             "created_at": at, "updated_at": at},
            {"merchant_id": merchant, "key": f"{key}-fenced", "state": "aborted",
             "lease_token": 0, "created_at": at, "updated_at": at},
        ],
        Transaction: [transaction],
        LedgerEntry: [
            {"merchant_id": merchant, "entry_id": str(uuid.uuid4()), "transaction_id": key,
             "amount": 100, "currency": "BRL", "kind": "charge", "created_at": at},
        ],
        OutboxEvent: [
            {"merchant_id": merchant, "event_id": str(uuid.uuid4()), "transaction_id": key,
             "type": kind, "payload": "{}", "created_at": at}
            for kind in ("transaction.completed", "transaction.reversed")[: 1 + n % 2]
        ],
        RequestEvent: [
            {"merchant_id": merchant, "event_id": str(uuid.uuid4()), "ts": at,
             "idempotency_key": key, "endpoint": "create", "outcome": "created",
             "http_status": 201, "latency_ms": 2.0},
        ],
    }  # fmt: skip


async def _seed(url: str) -> None:
    engine = create_engine_for(url)
    try:
        rows: dict[Any, list[dict[str, Any]]] = defaultdict(list)
        at = datetime(2026, 11, 20, 10, tzinfo=UTC)
        for merchant in MERCHANTS:
            for n in range(PAYMENTS):
                for model, values in _rows(merchant, n, at + timedelta(seconds=n)).items():
                    rows[model] += values
        async with engine.begin() as conn:
            for model in (IdempotencyKey, Transaction, LedgerEntry, OutboxEvent, RequestEvent):
                await conn.execute(insert(model), rows[model])
    finally:
        await engine.dispose()


def create_engine_for(url: str) -> Any:
    return create_engine(Settings(database_url=url))


def test_relay_retention_and_export_across_the_shards(
    citus_db: Backend, citus: CitusCluster, tmp_path: Path
) -> None:
    dsn = citus_db.url.replace("+asyncpg", "")
    assert len(merchants_by_worker(dsn, MERCHANTS)) == 2  # both workers hold some
    asyncio.run(_seed(citus_db.url))

    async def off_path() -> tuple[int, Any, Any]:
        engine = create_engine_for(citus_db.url)
        try:
            numbered = 0
            while batch := await number_committed(engine, batch=7):  # many small batches
                numbered += batch
            exported = await export_day(engine, tmp_path / "lake", DAY)
            purged = await purge(
                engine,
                retention_seconds=1.0,
                tolerance_seconds=0.0,
                now=datetime.now(UTC),
            )
            return numbered, exported, purged
        finally:
            await engine.dispose()

    numbered, exported, purged = asyncio.run(off_path())

    # the relay: every event numbered, gapless per merchant, a reversal after its completion
    events = PAYMENTS + PAYMENTS // 2
    assert numbered == len(MERCHANTS) * events
    rows = citus_db.sql(
        "SELECT merchant_id, transaction_id, type, seq FROM outbox_event ORDER BY merchant_id, seq"
    )
    by_merchant: dict[str, list[int]] = defaultdict(list)
    seq_of: dict[tuple[str, str, str], int] = {}
    for merchant, txn, kind, seq in rows:
        by_merchant[merchant].append(seq)
        seq_of[(merchant, txn, kind)] = seq
    assert all(seqs == list(range(1, events + 1)) for seqs in by_merchant.values()), by_merchant
    for (merchant, txn, kind), seq in seq_of.items():
        if kind == "transaction.reversed":
            assert seq_of[(merchant, txn, "transaction.completed")] < seq

    # the export: the day's rows of every shard in the lake, the events marked exported
    everyone = len(MERCHANTS) * PAYMENTS
    assert exported.rows == {
        "request_events": everyone, "transactions": everyone, "ledger_entries": everyone
    }  # fmt: skip
    assert exported.marked == everyone
    lake = read_partition(tmp_path / "lake", "transactions", DAY)
    assert lake is not None and set(lake.column("merchant_id").to_pylist()) == set(MERCHANTS)

    # retention: every shard's tombstones and exported events go, processed keys stay
    assert purged.tombstones == everyone
    assert purged.request_events == everyone
    left = citus_db.sql("SELECT state, count(*) FROM idempotency_key GROUP BY state")
    assert dict(left) == {"completed": everyone}
