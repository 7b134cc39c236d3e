"""A batch of finishes on Postgres completes its keys in one ``UPDATE … FROM unnest(…)``
(``Finish.run_together``, ``store.complete_together``): each finish learns whether its own
lease completed the key — a lease taken over meanwhile completes nothing and writes no
transaction — approvals and declines share the batch, and a key another transaction holds
past the finishes' lock timeout fails its own finish only (the batch is written again finish
by finish)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import event, text
from sqlalchemy.ext.asyncio import AsyncConnection

from api.acquirer.types import Authorization
from api.transactions.service import Finish, TransactionService
from tests.support.backend import Backend
from tests.support.stalls import dsn, held
from tests.support.transaction_service import (
    APPROVED,
    ApprovingAcquirer,
    claim_key,
    new_payment,
    running_service,
)

MERCHANT = "mer_finishes_in_one_update"
DECLINED = Authorization(
    approved=False,
    authorization_code=None,
    decline_reason="insufficient_funds",
    response_code="51",
    stan="000002",
)


@pytest.fixture
async def service(private_pg_backend: Backend) -> AsyncIterator[TransactionService]:
    async with running_service(private_pg_backend, ApprovingAcquirer()) as service:
        yield service


@contextmanager
def statements_sent(service: TransactionService) -> Iterator[list[str]]:
    """The first two words of every UPDATE and INSERT statement sent while inside."""
    sent: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        words = statement.split()
        if words and words[0].upper() in ("UPDATE", "INSERT"):
            sent.append(" ".join(words[:3] if words[0].upper() == "INSERT" else words[:2]))

    event.listen(service.engine.sync_engine, "before_cursor_execute", record)
    try:
        yield sent
    finally:
        event.remove(service.engine.sync_engine, "before_cursor_execute", record)


async def _finishes(service: TransactionService, count: int) -> list[Finish]:
    """``count`` keys claimed (token 1), each with its finish: every third declined."""
    works = []
    for n in range(count):
        key, payment, _fp = new_payment(100 + n)
        await claim_key(service, MERCHANT, key, payment, now=datetime.now(UTC), lease_s=30)
        auth = DECLINED if n % 3 == 2 else APPROVED
        works.append(service.finish_work(MERCHANT, key, payment, auth, 1, datetime.now(UTC)))
    return works


async def _one_batch(service: TransactionService, works: list[Any]) -> list[Any]:
    """``works`` in one batch of the service's finishes: queued while a first work holds
    every lane."""
    gate, started = asyncio.Event(), asyncio.Event()
    group = service.finishes
    group.lanes = group.max_lanes = 1

    async def held(_conn: AsyncConnection) -> None:
        started.set()
        await gate.wait()

    first = asyncio.ensure_future(group.run(held))
    await started.wait()
    rest = [asyncio.ensure_future(group.run(work)) for work in works]
    await asyncio.sleep(0)
    assert len(group._pending) == len(works)
    gate.set()
    await first
    return list(await asyncio.gather(*rest, return_exceptions=True))


async def _states(service: TransactionService) -> dict[str, tuple[str, int, int]]:
    """Per key: (state, its transactions, its ledger entries)."""
    async with service.engine.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT k.key, k.state,"
                ' (SELECT count(*) FROM "transaction" t'
                "   WHERE t.merchant_id = k.merchant_id AND t.id = k.key),"
                " (SELECT count(*) FROM ledger_entry l"
                "   WHERE l.merchant_id = k.merchant_id AND l.transaction_id = k.key)"
                " FROM idempotency_key k WHERE k.merchant_id = :m"
            ),
            {"m": MERCHANT},
        )
        return {row[0]: (row[1], row[2], row[3]) for row in rows}


async def test_a_batch_of_finishes_is_one_update(service: TransactionService) -> None:
    works = await _finishes(service, 6)
    with statements_sent(service) as sent:
        results = await _one_batch(service, works)
    assert results == [work.text for work in works]
    # One UPDATE for the six keys, then one INSERT per table (transaction, ledger, outbox).
    assert sent.count("UPDATE idempotency_key") == 1
    assert [s for s in sent if s.startswith("INSERT")] == [
        "INSERT INTO transaction",
        "INSERT INTO ledger_entry",
        "INSERT INTO outbox_event",
    ]
    states = await _states(service)
    for n, work in enumerate(works):
        assert states[work.txn.id] == ("completed", 1, 0 if n % 3 == 2 else 1)


async def test_a_finish_whose_lease_was_taken_over_writes_nothing(
    service: TransactionService,
) -> None:
    works = await _finishes(service, 5)
    async with service.engine.begin() as conn:  # the completer took key 1's lease over
        await conn.execute(
            text("UPDATE idempotency_key SET lease_token = 2 WHERE merchant_id = :m AND key = :k"),
            {"m": MERCHANT, "k": works[1].txn.id},
        )
    with statements_sent(service) as sent:
        results = await _one_batch(service, works)
    assert sent.count("UPDATE idempotency_key") == 1
    assert results[1] is None
    assert [r for i, r in enumerate(results) if i != 1] == [
        w.text for i, w in enumerate(works) if i != 1
    ]
    states = await _states(service)
    assert states[works[1].txn.id] == ("processing", 0, 0)
    assert states[works[0].txn.id] == ("completed", 1, 1)


LOCK_KEY_ROW = "SELECT 1 FROM idempotency_key WHERE merchant_id = $1 AND key = $2 FOR UPDATE"


async def test_a_held_key_fails_its_own_finish_only(
    service: TransactionService, private_pg_backend: Backend
) -> None:
    works = await _finishes(service, 4)
    # An operator's open transaction holds key 2's row past the finishes' lock timeout.
    async with held(dsn(private_pg_backend), LOCK_KEY_ROW, MERCHANT, works[2].txn.id):
        with statements_sent(service) as sent:
            results = await _one_batch(service, works)
    assert sent.count("UPDATE idempotency_key") > 1  # the one UPDATE, then finish by finish
    assert isinstance(results[2], Exception)
    assert [r for i, r in enumerate(results) if i != 2] == [
        w.text for i, w in enumerate(works) if i != 2
    ]
    states = await _states(service)
    assert states[works[2].txn.id] == ("processing", 0, 0)
    assert all(states[w.txn.id][0] == "completed" for i, w in enumerate(works) if i != 2)
