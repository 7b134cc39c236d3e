"""A batch of finishes on Postgres completes its keys in one ``UPDATE … FROM unnest(…)``
(``Finish.run_together``, ``store.complete_together``): each finish learns whether its own
lease completed the key — a lease taken over meanwhile completes nothing and writes no
transaction — approvals and declines share the batch, and a key another transaction holds
past the finishes' lock timeout fails its own finish only (the batch is written again finish
by finish)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
from sqlalchemy import text

from api.acquirer.types import Authorization
from api.transactions.service import Finish, TransactionService
from tests.support.backend import Backend
from tests.support.batches import one_batch, statements_sent
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


async def _finishes(service: TransactionService, count: int) -> list[Finish]:
    """``count`` keys claimed (token 1), each with its finish: every third declined."""
    works = []
    for n in range(count):
        key, payment, _fp = new_payment(100 + n)
        await claim_key(service, MERCHANT, key, payment, now=datetime.now(UTC), lease_s=30)
        auth = DECLINED if n % 3 == 2 else APPROVED
        works.append(service.finish_work(MERCHANT, key, payment, auth, 1, datetime.now(UTC)))
    return works


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
    with statements_sent(service.engine) as sent:
        results = await one_batch(service.finishes, works)
    assert results == [work.text for work in works]
    # One UPDATE for the six keys, then one INSERT per table (transaction, ledger, outbox).
    assert sent.count("UPDATE idempotency_key") == 1
    assert [s for s in sent if s.startswith("INSERT")] == [
        "INSERT transaction",
        "INSERT ledger_entry",
        "INSERT outbox_event",
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
    with statements_sent(service.engine) as sent:
        results = await one_batch(service.finishes, works)
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
        with statements_sent(service.engine) as sent:
            results = await one_batch(service.finishes, works)
    assert sent.count("UPDATE idempotency_key") > 1  # the one UPDATE, then finish by finish
    assert isinstance(results[2], Exception)
    assert [r for i, r in enumerate(results) if i != 2] == [
        w.text for i, w in enumerate(works) if i != 2
    ]
    states = await _states(service)
    assert states[works[2].txn.id] == ("processing", 0, 0)
    assert all(states[w.txn.id][0] == "completed" for i, w in enumerate(works) if i != 2)
