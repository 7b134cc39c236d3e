"""A batch of finishes commits and its connection is lost before the COMMIT's answer
arrives (``acquire._write_ending`` retries, ``WRITE_ATTEMPTS``): the retry finds the lease
gone and writes nothing, reads the key, finds its own stored response and answers 201
``created`` — not a replay (``Idempotent-Replayed``, request-event outcome ``replayed``, a
late answer counted), which contract §2 keeps for "same key, same payload, already processed"
and §5 counts as a duplicate request."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest

from api.events.writer import RequestOutcome
from api.metrics import ACQUIRER_LATE_ANSWERS
from api.transactions import acquire
from api.transactions.outcome import IdempotencyStatus
from api.transactions.service import TransactionService
from tests.support.backend import Backend
from tests.support.transaction_service import (
    APPROVED,
    ApprovingAcquirer,
    claim_key,
    new_payment,
    rows_written,
    running_service,
)

MERCHANT = "mer_finish_ack_lost"


@pytest.fixture
async def service(private_pg_backend: Backend) -> AsyncIterator[TransactionService]:
    async with running_service(private_pg_backend, ApprovingAcquirer()) as service:
        yield service


def lose_first_finish_acknowledgement(service: TransactionService) -> None:
    """The first batch of finishes commits, then its connection is lost before the answer."""
    committed = service.finishes.run
    lost: list[bool] = []

    async def run(work: Any, *, partition: object = None) -> str | None:
        result = await committed(work, partition=partition)
        if not lost:
            lost.append(True)
            raise asyncpg.exceptions.ConnectionDoesNotExistError("connection lost after COMMIT")
        return result

    service.finishes.run = run  # type: ignore[method-assign]


async def test_a_finish_whose_commit_ack_was_lost_answers_created(
    service: TransactionService,
) -> None:
    key, payment, _fp = new_payment(777)
    await claim_key(service, MERCHANT, key, payment, now=datetime.now(UTC), lease_s=30)
    lose_first_finish_acknowledgement(service)
    late_before = ACQUIRER_LATE_ANSWERS._value.get()

    outcome = await acquire._write_ending(
        service,
        MERCHANT,
        key,
        payment,
        APPROVED,
        token=1,
        created_at=datetime.now(UTC),
        event=RequestOutcome.CREATED,
    )

    # What holds: the retry wrote nothing twice, and the answer is the stored approval.
    assert await rows_written(service.engine, MERCHANT) == (1, 1, 1)
    assert outcome.status == 201
    # The request that created the transaction is told so, not that it was a replay.
    assert outcome.event == RequestOutcome.CREATED
    assert outcome.idempotency_status == IdempotencyStatus.CREATED
    assert "Idempotent-Replayed" not in outcome.headers
    assert ACQUIRER_LATE_ANSWERS._value.get() == late_before
