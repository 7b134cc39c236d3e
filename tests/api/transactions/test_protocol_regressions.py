"""What the SPIN model of the protocol (docs/protocol/) found, replayed against the code.

The model's counterexample for the code before 821217e (its mutant
``MUTANT_VOID_BEFORE_FENCE``, check M6 of ``scripts/verify.sh``): an abort takes a processing
key over, stalls past its lease, the completer takes the key over in turn and completes it
*approved* — and then the stalled abort voids the issuer call in its own commit. The ledger
says approved, the issuer says voided. Since 821217e ``TransactionService.fence_owned``
commits the fence, the void (enlisted on the same connection) and the outbox event in one
transaction guarded by the lease token, so a stale owner does none of the three.

These tests drive the service and the store directly, step by step, on both backends: the
interleaving is the model's trail, which no timing of HTTP requests reproduces reliably.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from api.config import Settings
from api.db import atomic, create_engine, utcnow
from api.idempotency import store
from api.idempotency.keys import body_fingerprint
from api.idempotency.store import KeyRecord
from api.transactions import recovery, resolution
from api.transactions.issuer import SimulatedIssuer
from api.transactions.schemas import TransactionCreate
from api.transactions.service import TransactionService
from tests.support.backend import Backend
from tests.support.client import body, card


@pytest.fixture
async def service(backend: Backend) -> AsyncIterator[TransactionService]:
    settings = Settings(
        database_url=backend.database_url,
        var_dir=backend.tmp / "var",
        db_pool_size=2,  # Postgres is shared
        issuer_slow_seconds=0.0,
        issuer_timeout=5.0,
        lease_seconds=30.0,
        issuer_deadline=60.0,
        redis_url=None,
    )
    engine = create_engine(settings)
    try:
        yield TransactionService(
            engine, SimulatedIssuer(engine, slow_seconds=settings.issuer_slow_seconds), settings
        )
    finally:
        await engine.dispose()


async def _row(engine: AsyncEngine, statement: str, **params: Any) -> Any:
    async with engine.connect() as conn:
        return (await conn.execute(text(statement), params)).first()


async def _count(engine: AsyncEngine, statement: str, **params: Any) -> int:
    row = await _row(engine, statement, **params)
    return int(row[0])


def _slow_payment() -> TransactionCreate:
    """A slow-issuer payment: it takes the three-step path (claim, issuer, final write)."""
    return TransactionCreate.model_validate(body(card=card("tok_issuer_slow")))


async def _claimed(service: TransactionService, payment: TransactionCreate) -> KeyRecord:
    """A key claimed by a first driver (lease token 1) whose issuer call was recorded."""
    merchant, key = f"mer_spin_{uuid.uuid4().hex[:12]}", str(uuid.uuid4())
    async with atomic(service.engine) as conn:
        assert await store.claim(
            conn,
            merchant_id=merchant,
            key=key,
            fingerprint=body_fingerprint(payment),
            request=payment.model_dump_json(),
            terminal_id=payment.terminal_id,
            now=utcnow(),
            lease_s=service.settings.lease_seconds,
            deadline_s=service.settings.issuer_deadline,
        )
    auth = await service.issuer.authorize(service.auth_request(merchant, key, payment))
    assert auth.approved
    record = await service.read(merchant, key)
    assert record is not None and record.lease_token == 1
    return record


async def _take_over(service: TransactionService, record: KeyRecord) -> int:
    async with atomic(service.engine) as conn:
        token = await store.take_over(
            conn, record, now=utcnow(), lease_s=service.settings.lease_seconds
        )
    assert token is not None
    return token


async def _lease_runs_out(service: TransactionService, record: KeyRecord, token: int) -> None:
    async with atomic(service.engine) as conn:
        await store.release(
            conn,
            merchant_id=record.merchant_id,
            key=record.key,
            token=token,
            until=utcnow() - timedelta(seconds=1),
        )


async def _issuer_row(service: TransactionService, record: KeyRecord) -> Any:
    return await _row(
        service.engine,
        "SELECT result, voided_at FROM issuer_authorization WHERE issuer_key = :k",
        k=service.issuer_key(record.merchant_id, record.key),
    )


async def _aborted_events(service: TransactionService, record: KeyRecord) -> int:
    return await _count(
        service.engine,
        "SELECT count(*) FROM outbox_event WHERE merchant_id = :m AND transaction_id = :k "
        "AND type = 'transaction.aborted'",
        m=record.merchant_id,
        k=record.key,
    )


async def test_a_stale_owner_neither_voids_nor_fences_the_key_it_lost(
    service: TransactionService,
) -> None:
    """The M6 trail: abort takes over (token 2) and stalls; the completer takes over
    (token 3) and completes approved; the stalled abort's fence_owned, and a stale settle()
    past the deadline, must leave the approval, the key and the outbox alone."""
    payment = _slow_payment()
    record = await _claimed(service, payment)

    abort_token = await _take_over(service, record)  # _abort_existing: take_over …
    await _lease_runs_out(service, record, abort_token)  # … then it stalls past its lease

    current = await service.read(record.merchant_id, record.key)
    assert current is not None
    completer_token = await _take_over(service, current)  # Completer._recover
    outcome = await service.drive(
        record.merchant_id,
        record.key,
        payment,
        token=completer_token,
        created_at=current.created_at,
        event="created",
    )
    assert outcome.status == 201
    assert b'"status":"approved"' in outcome.body.replace(b" ", b"")

    # The stalled abort resumes: service.fence_owned with the token it no longer holds.
    await recovery.fence(service, record, abort_token)
    # And a stale settle() that believes the issuer deadline has passed.
    past_deadline = dataclasses.replace(record, deadline_at=utcnow() - timedelta(seconds=1))
    assert await recovery.settle(service, past_deadline, abort_token, utcnow()) is None

    after = await service.read(record.merchant_id, record.key)
    assert after is not None
    assert (after.state, after.lease_token) == (store.COMPLETED, completer_token)
    result, voided_at = await _issuer_row(service, record)
    assert (result, voided_at) == ("approved", None)  # the issuer agrees with the ledger
    status = await _row(
        service.engine,
        'SELECT status FROM "transaction" WHERE merchant_id = :m AND id = :k',
        m=record.merchant_id,
        k=record.key,
    )
    assert status[0] == "approved"
    assert await _aborted_events(service, record) == 0


async def test_the_owner_fences_and_voids_in_one_commit_and_a_late_driver_cannot_charge(
    service: TransactionService,
) -> None:
    """The current owner's fence_owned aborts the key, voids the issuer call and announces
    it together; the first driver, late with its approval, is refused by the lease token
    and gets the tombstone's answer (410), and no transaction exists."""
    payment = _slow_payment()
    record = await _claimed(service, payment)
    owner = await _take_over(service, record)

    await recovery.fence(service, record, owner)

    after = await service.read(record.merchant_id, record.key)
    assert after is not None and after.state == store.ABORTED
    result, voided_at = await _issuer_row(service, record)
    assert result == "voided" and voided_at is not None
    assert await _aborted_events(service, record) == 1

    late = await service.drive(
        record.merchant_id,
        record.key,
        payment,
        token=1,
        created_at=record.created_at,
        event="created",
    )
    assert late.status == 410
    assert (
        await _count(
            service.engine,
            'SELECT count(*) FROM "transaction" WHERE merchant_id = :m AND id = :k',
            m=record.merchant_id,
            k=record.key,
        )
        == 0
    )


class _VoidFails(SimulatedIssuer):
    """Records the void on the caller's connection, then fails before the commit."""

    async def void(
        self,
        issuer_key: str,
        *,
        merchant_id: str,
        amount: int,
        currency: str,
        conn: AsyncConnection | None = None,
    ) -> None:
        await super().void(
            issuer_key, merchant_id=merchant_id, amount=amount, currency=currency, conn=conn
        )
        raise RuntimeError("issuer connector failed after the void was written")


async def test_fence_and_void_roll_back_together(service: TransactionService) -> None:
    """Fence and void commit together or not at all: a failure after the enlisted void
    leaves the key processing under the same owner and the authorization standing."""
    payment = _slow_payment()
    record = await _claimed(service, payment)
    owner = await _take_over(service, record)
    service.issuer = _VoidFails(service.engine, slow_seconds=0.0)

    with pytest.raises(RuntimeError, match="issuer connector failed"):
        await recovery.fence(service, record, owner)

    after = await service.read(record.merchant_id, record.key)
    assert after is not None
    assert (after.state, after.lease_token) == (store.PROCESSING, owner)
    result, voided_at = await _issuer_row(service, record)
    assert (result, voided_at) == ("approved", None)
    assert await _aborted_events(service, record) == 0


# ----------------------------------------------- issue 14, the smaller ones (deterministic)
async def test_an_original_that_loses_its_final_write_to_a_re_drive_answers_202(
    service: TransactionService,
) -> None:
    """The original create's issuer call answered, but its lease ran out before the final
    write and the completer took the key over (it is re-driving it now). The key is the
    server's to finish: 202 processing with Retry-After, not 409 'in progress'."""
    payment = _slow_payment()
    record = await _claimed(service, payment)
    await _lease_runs_out(service, record, 1)
    current = await service.read(record.merchant_id, record.key)
    assert current is not None
    await _take_over(service, current)  # Completer._recover: token 2, lease live

    late = await service.drive(
        record.merchant_id,
        record.key,
        payment,
        token=1,
        created_at=record.created_at,
        event="created",
    )
    assert late.status == 202, late.body
    # rendered with Retry-After
    assert late.idempotency_status == "in_progress" and late.retry_after
    assert b'"status":"processing"' in late.body


async def test_an_abort_that_loses_its_take_over_to_a_completion_tells_the_truth(
    service: TransactionService,
) -> None:
    """The abort read the key processing (lease run out), then the owner's final write
    committed before the abort's take-over: the take-over fails on the token, and the abort
    must answer what happened (200, the approved transaction), not 409."""
    payment = _slow_payment()
    record = await _claimed(service, payment)
    await _lease_runs_out(service, record, 1)
    stale = await service.read(record.merchant_id, record.key)  # what the abort read
    assert stale is not None and stale.state == store.PROCESSING

    auth = await service.issuer.authorize(
        service.auth_request(record.merchant_id, record.key, payment)
    )
    async with atomic(service.engine) as conn:  # the owner completes in between
        text_ = await service._finish(
            conn, record.merchant_id, record.key, payment, auth, 1, record.created_at
        )
    assert text_ is not None

    answer = await resolution._abort_existing(service, stale)
    assert answer.status == 200, answer.body
    assert answer.event == "already_processed"
    assert b'"status":"approved"' in answer.body
