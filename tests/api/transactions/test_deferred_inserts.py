"""A batch of finishes sends its inserts — transaction rows, ledger entries, outbox events —
as one statement per table after its last work (api/deferred.py), on both backends; when
that statement fails, the batch is written again one statement at a time, so only the work
whose row failed gets the error and its batch-mates commit."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from api.models import LedgerEntry, OutboxEvent, Transaction
from api.outbox import writer as outbox
from api.transactions import repository
from api.transactions.group_commit import GroupCommit
from tests.support.backend import Backend
from tests.support.batches import one_batch, statements_sent
from tests.support.transaction_service import private_engine

MERCHANT = "mer_deferred_inserts"
BATCH = 6


@pytest.fixture
async def engine(private_backend: Backend) -> AsyncIterator[AsyncEngine]:
    async with private_engine(private_backend) as engine:
        yield engine


def _txn(n: int) -> repository.NewTransaction:
    now = datetime.now(UTC)
    return repository.NewTransaction(
        merchant_id=MERCHANT,
        id=f"00000000-0000-4000-8000-{n:012d}",
        terminal_id="T-1",
        type="purchase",
        amount=100 + n,
        currency="BRL",
        card_last4="4242",
        card_brand="visa",
        card_fingerprint="fp",
        installments=1,
        status="approved",
        decline_reason=None,
        authorization_code="A1B2C3",
        captured_at=None,
        created_at=now,
        processed_at=now,
        metadata_json=None,
    )


async def _finish(conn: AsyncConnection, txn: repository.NewTransaction) -> str:
    """What a finish writes after its key's UPDATE: the transaction, its charge, its event."""
    await repository.insert_transaction(conn, txn)
    await outbox.append(
        conn,
        merchant_id=MERCHANT,
        event_type=outbox.COMPLETED,
        transaction_id=txn.id,
        data=repository.body_of(txn),
        now=txn.processed_at,
    )
    return txn.id


def _works(txns: list[repository.NewTransaction]) -> list[Any]:
    return [lambda conn, t=t: _finish(conn, t) for t in txns]


async def _count(engine: AsyncEngine, table: Any, column: Any) -> int:
    async with engine.connect() as conn:
        query = select(func.count()).select_from(table).where(column == MERCHANT)
        return int((await conn.execute(query)).scalar_one())


async def test_a_batch_sends_one_insert_per_table(engine: AsyncEngine) -> None:
    group: GroupCommit[str] = GroupCommit(engine, kind="finish", lanes=1, defer_inserts=True)
    txns = [_txn(n) for n in range(BATCH)]
    with statements_sent(engine) as sent:
        results = await one_batch(group, _works(txns))
    assert results == [t.id for t in txns]
    # Per-work inserts would be 3 × BATCH statements; deferred, one per table, the
    # transaction rows before the ledger entries that reference them.
    assert sent == ["INSERT transaction", "INSERT ledger_entry", "INSERT outbox_event"]
    assert await _count(engine, Transaction, Transaction.merchant_id) == BATCH
    assert await _count(engine, LedgerEntry, LedgerEntry.merchant_id) == BATCH
    assert await _count(engine, OutboxEvent, OutboxEvent.merchant_id) == BATCH


async def test_without_deferral_each_work_sends_its_own(engine: AsyncEngine) -> None:
    group: GroupCommit[str] = GroupCommit(engine, kind="finish", lanes=1)
    txns = [_txn(n) for n in range(3)]
    with statements_sent(engine) as sent:
        assert await one_batch(group, _works(txns)) == [t.id for t in txns]
    assert sent == ["INSERT transaction", "INSERT ledger_entry", "INSERT outbox_event"] * 3


async def test_a_failed_flush_blames_only_the_work_whose_row_failed(engine: AsyncEngine) -> None:
    txns = [_txn(n) for n in range(BATCH)]
    clash = txns[2]
    async with engine.begin() as conn:  # its row already there: its insert must fail
        await repository.insert_transaction(conn, clash)
    group: GroupCommit[str] = GroupCommit(engine, kind="finish", lanes=1, defer_inserts=True)
    with statements_sent(engine) as sent:
        results = await one_batch(group, _works(txns))
    assert isinstance(results[2], IntegrityError)
    assert [r for i, r in enumerate(results) if i != 2] == [
        t.id for i, t in enumerate(txns) if i != 2
    ]
    # First the batch's deferred statements (the transaction insert fails), then every work
    # again one statement at a time: the clash alone fails, the others commit.
    assert sent[0] == "INSERT transaction"
    assert sent.count("INSERT transaction") > 1
    assert await _count(engine, Transaction, Transaction.merchant_id) == BATCH
    assert await _count(engine, LedgerEntry, LedgerEntry.merchant_id) == BATCH
    assert await _count(engine, OutboxEvent, OutboxEvent.merchant_id) == BATCH - 1
