"""A batch of claims is one ``INSERT … VALUES (…), (…) ON CONFLICT DO NOTHING RETURNING``
(api/transactions/group_commit.py, ``together``), on both backends: each claim learns
from the returned identity (key, claim time, lease end) whether its own row went in — a key
already there, or claimed twice in one batch, is claimed by one row only — and a statement
that fails for one row's sake is sent again row by row, so only that claim gets the error."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from api.idempotency import store
from api.models import IdempotencyKey
from api.transactions.group_commit import GroupCommit, InsertIfAbsent
from tests.support.backend import Backend
from tests.support.batches import one_batch, statements_sent
from tests.support.transaction_service import private_engine

MERCHANT = "mer_claims_in_one_insert"


@pytest.fixture
async def engine(private_backend: Backend) -> AsyncIterator[AsyncEngine]:
    async with private_engine(private_backend) as engine:
        yield engine


def _claim(key: str, at: datetime, sent: list[str] | None = None) -> InsertIfAbsent:
    row = store.claim_row(
        merchant_id=MERCHANT,
        key=key,
        fingerprint=f"fp-{key}",
        request="{}",
        terminal_id="T-1",
        now=at,
        lease_until=at + timedelta(seconds=20),
        deadline_s=60,
    )
    return InsertIfAbsent(
        IdempotencyKey,
        row,
        store.CLAIM_IDENTITY,
        sent=(lambda: sent.append(key)) if sent is not None else (lambda: None),
    )


def _key(n: int) -> str:
    return f"00000000-0000-4000-8000-{n:012d}"


def _claims(engine: AsyncEngine) -> GroupCommit[Any]:
    return GroupCommit(engine, kind="claim", lanes=1, new_key=True, together=True)


async def _rows(engine: AsyncEngine) -> dict[str, datetime]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            select(IdempotencyKey.key, IdempotencyKey.created_at).where(
                IdempotencyKey.merchant_id == MERCHANT
            )
        )
        return {key: created for key, created in rows}


async def test_a_batch_of_claims_is_one_insert(engine: AsyncEngine) -> None:
    at = datetime.now(UTC)
    sent: list[str] = []
    works = [_claim(_key(n), at + timedelta(microseconds=n), sent) for n in range(8)]
    with statements_sent(engine) as statements:
        results = await one_batch(_claims(engine), works)
    assert results == [True] * 8
    assert statements == ["INSERT idempotency_key"]  # one statement for the eight claims
    assert sorted(sent) == sorted(_key(n) for n in range(8))  # each told before it was sent
    assert set(await _rows(engine)) == {_key(n) for n in range(8)}


async def test_a_key_already_there_and_a_key_claimed_twice_go_in_once(
    engine: AsyncEngine,
) -> None:
    at = datetime.now(UTC)
    async with engine.begin() as conn:  # an earlier claim of key 1
        await _claim(_key(1), at - timedelta(seconds=1))(conn)
    works = [
        _claim(_key(2), at + timedelta(microseconds=3)),  # key 2, queued first: goes in
        _claim(_key(1), at + timedelta(microseconds=1)),  # exists: not ours
        _claim(_key(2), at + timedelta(microseconds=2)),  # key 2 again, later: finds it
        _claim(_key(3), at + timedelta(microseconds=4)),
    ]
    with statements_sent(engine) as statements:
        results = await one_batch(_claims(engine), works)
    assert statements == ["INSERT idempotency_key"]
    assert results == [True, False, False, True]
    rows = await _rows(engine)
    assert rows[_key(1)] == at - timedelta(seconds=1)  # the earlier claim, untouched
    assert rows[_key(2)] == at + timedelta(microseconds=3)  # the first queued of key 2


async def test_a_row_that_fails_the_statement_fails_alone(engine: AsyncEngine) -> None:
    at = datetime.now(UTC)
    works = [_claim(_key(n), at + timedelta(microseconds=n)) for n in range(5)]
    works[3].row["state"] = None  # NOT NULL: this row, and so the whole statement, fails
    with statements_sent(engine) as statements:
        results = await one_batch(_claims(engine), works)
    assert isinstance(results[3], IntegrityError)
    assert [r for i, r in enumerate(results) if i != 3] == [True] * 4
    # The one statement, then the claims row by row (the failing one alone answered).
    assert statements[0] == "INSERT idempotency_key" and len(statements) > 1
    assert set(await _rows(engine)) == {_key(n) for n in range(5) if n != 3}
