"""What the SPIN model of the protocol (docs/protocol/) found, replayed against the code.

The model's counterexample for the code before 821217e (its mutant
``MUTANT_VOID_BEFORE_FENCE``, check M6 of ``scripts/verify.sh``): an abort takes a processing
key over, stalls past its lease, another owner takes the key over in turn and settles it —
and then the stalled abort undoes the authorization in its own commit, so the two sides
disagree. Across the acquirer boundary (contract §2.4, §2.9) the abort's fence and the
reversal advice it queues (kind ``abort``) commit in one transaction guarded by the lease
token (``recovery.fence``), with the outbox event: a stale owner does none of the three, and
the current owner does all three or none.

These tests drive the service and the store directly, step by step, on both backends, against
a simulated acquirer host of their own: the interleaving is the model's trail, which no timing
of HTTP requests reproduces reliably. A key's one 0200 is sent by ``_claimed``; no step here
ever sends a second one (a late owner's final write is ``acquire._write_ending`` with the
answer it already has).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from api.acquirer import advice
from api.acquirer.host import store as host_store
from api.acquirer.host.process import AcquirerProcess
from api.acquirer.runtime import AcquirerRuntime
from api.acquirer.types import Authorization
from api.db import atomic, create_engine, utcnow
from api.events.writer import RequestOutcome
from api.idempotency import store
from api.idempotency.store import KeyRecord
from api.transactions import acquire, recovery, resolution
from api.transactions.outcome import Outcome
from api.transactions.schemas import TransactionCreate
from api.transactions.service import TransactionService
from tests.support.backend import Backend
from tests.support.client import body
from tests.support.transaction_service import claim_key, service_settings

ACQUIRER_TIMEOUT_S = 10.0


@pytest.fixture
def acquirer_host(tmp_path: Path) -> Iterator[AcquirerProcess]:
    """A simulated acquirer host of this test's own: its store is read by the test alone."""
    host = AcquirerProcess(store=tmp_path / "acquirer" / "acquirer.sqlite3").start()
    try:
        yield host
    finally:
        host.stop()


@pytest.fixture
async def service(
    private_backend: Backend, acquirer_host: AcquirerProcess
) -> AsyncIterator[TransactionService]:
    # A database of its own: on the suite's shared ones, the servers' completers take over
    # the leases these tests run out on purpose (CI: a final write lost its key to one).
    settings = service_settings(
        private_backend,
        db_pool_size=2,  # Postgres is shared
        acquirer_url=acquirer_host.url,
        acquirer_timeout=ACQUIRER_TIMEOUT_S,
        answer_within=5.0,
        lease_seconds=30.0,
        issuer_deadline=60.0,
    )
    engine = create_engine(settings)
    acquirer = await AcquirerRuntime.open(settings)
    try:
        yield TransactionService(engine, acquirer.link, settings)
    finally:
        await acquirer.close()
        await engine.dispose()


async def _row(engine: AsyncEngine, statement: str, **params: Any) -> Any:
    async with engine.connect() as conn:
        return (await conn.execute(text(statement), params)).first()


async def _count(engine: AsyncEngine, statement: str, **params: Any) -> int:
    row = await _row(engine, statement, **params)
    return int(row[0])


def _payment() -> TransactionCreate:
    return TransactionCreate.model_validate(body())


async def _claimed(
    service: TransactionService, payment: TransactionCreate
) -> tuple[KeyRecord, Authorization]:
    """A key claimed by a first driver (lease token 1) whose one 0200 the acquirer
    approved; the driver has not written its final write yet."""
    merchant, key = f"mer_spin_{uuid.uuid4().hex[:12]}", str(uuid.uuid4())
    await claim_key(
        service, merchant, key, payment, now=utcnow(), lease_s=service.settings.lease_seconds
    )
    auth = await service.acquirer.authorize(
        service.auth_request(merchant, key, payment), timeout_s=ACQUIRER_TIMEOUT_S
    )
    assert auth.approved
    record = await service.read(merchant, key)
    assert record is not None and record.lease_token == 1
    return record, auth


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


async def _final_write(
    service: TransactionService,
    record: KeyRecord,
    payment: TransactionCreate,
    auth: Authorization,
    token: int,
) -> Outcome:
    """The driver holding ``token`` writes the acquirer's answer it already has (its final
    write, guarded by the token) — no 0200 is sent."""
    return await acquire._write_ending(
        service,
        record.merchant_id,
        record.key,
        payment,
        auth,
        token=token,
        created_at=record.created_at,
        event=RequestOutcome.CREATED,
    )


async def _advices(service: TransactionService, record: KeyRecord) -> list[tuple[str, str]]:
    async with service.engine.connect() as conn:
        rows = await conn.execute(
            text("SELECT kind, rrn FROM acquirer_advice WHERE merchant_id = :m AND key = :k"),
            {"m": record.merchant_id, "k": record.key},
        )
        return [(str(kind), str(rrn)) for kind, rrn in rows]


async def _events(service: TransactionService, record: KeyRecord, kind: str) -> int:
    return await _count(
        service.engine,
        "SELECT count(*) FROM outbox_event WHERE merchant_id = :m AND transaction_id = :k "
        "AND type = :t",
        m=record.merchant_id,
        k=record.key,
        t=kind,
    )


async def _transactions(service: TransactionService, record: KeyRecord) -> list[tuple[Any, ...]]:
    async with service.engine.connect() as conn:
        rows = await conn.execute(
            text(
                'SELECT status, decline_reason, rrn FROM "transaction"'
                " WHERE merchant_id = :m AND id = :k"
            ),
            {"m": record.merchant_id, "k": record.key},
        )
        return [tuple(row) for row in rows]


def _one_0200(host: AcquirerProcess, service: TransactionService, record: KeyRecord) -> None:
    """The acquirer received exactly one 0200 for the key, and approved it."""
    seen = host_store.summary(host.store)[service.rrn(record.merchant_id, record.key)]
    assert (seen.requests, seen.approved) == (1, True)


async def test_a_stale_owner_neither_fences_nor_advises_the_key_it_lost(
    service: TransactionService, acquirer_host: AcquirerProcess
) -> None:
    """The M6 trail: abort takes over (token 2) and stalls; the completer takes over (token
    3) and settles the key in doubt (declined / acquirer_timeout, its ``timeout`` advice
    queued); the stalled abort's fence, and a stale in-doubt settlement, with the token they
    no longer hold, must leave the key, its one advice and the outbox alone."""
    payment = _payment()
    record, _ = await _claimed(service, payment)

    abort_token = await _take_over(service, record)  # _abort_existing: take_over …
    await _lease_runs_out(service, record, abort_token)  # … then it stalls past its lease

    current = await service.read(record.merchant_id, record.key)
    assert current is not None
    completer_token = await _take_over(service, current)  # Completer → recovery.recover
    settled = await acquire.settle_in_doubt(
        service,
        record.merchant_id,
        record.key,
        payment,
        token=completer_token,
        created_at=current.created_at,
        event=RequestOutcome.CREATED,
    )
    assert settled.status == 201
    assert b'"decline_reason":"acquirer_timeout"' in settled.body.replace(b" ", b"")

    # The stalled abort resumes: recovery.fence with the token it no longer holds.
    assert await recovery.fence(service, record, abort_token) is False
    # And a stale in-doubt settlement of the same key under that token writes nothing.
    stale = await acquire.settle_in_doubt(
        service,
        record.merchant_id,
        record.key,
        payment,
        token=abort_token,
        created_at=record.created_at,
        event=RequestOutcome.CREATED,
    )
    assert stale.status == 201 and stale.body == settled.body  # the row's answer, replayed

    after = await service.read(record.merchant_id, record.key)
    assert after is not None
    assert (after.state, after.lease_token) == (store.COMPLETED, completer_token)
    rrn = service.rrn(record.merchant_id, record.key)
    assert await _transactions(service, record) == [("declined", "acquirer_timeout", rrn)]
    assert await _advices(service, record) == [(advice.TIMEOUT, rrn)]  # one, the settlement's
    assert await _events(service, record, "transaction.completed") == 1
    assert await _events(service, record, "transaction.aborted") == 0
    _one_0200(acquirer_host, service, record)


async def test_the_owner_fences_and_queues_the_advice_in_one_commit_and_a_late_driver_cannot_charge(
    service: TransactionService, acquirer_host: AcquirerProcess
) -> None:
    """The current owner's fence aborts the key, queues the reversal advice of its 0200
    (kind ``abort``) and announces it together; the first driver, late with its approval, is
    refused by the lease token and gets the tombstone's answer (410), and no transaction
    exists."""
    payment = _payment()
    record, auth = await _claimed(service, payment)
    owner = await _take_over(service, record)

    assert await recovery.fence(service, record, owner) is True

    after = await service.read(record.merchant_id, record.key)
    assert after is not None and after.state == store.ABORTED
    rrn = service.rrn(record.merchant_id, record.key)
    assert await _advices(service, record) == [(advice.ABORT, rrn)]
    assert await _events(service, record, "transaction.aborted") == 1

    late = await _final_write(service, record, payment, auth, token=1)
    assert late.status == 410, late.body
    assert await _transactions(service, record) == []
    assert await _events(service, record, "transaction.completed") == 0
    assert await _advices(service, record) == [(advice.ABORT, rrn)]  # unchanged
    _one_0200(acquirer_host, service, record)


async def test_fence_and_advice_roll_back_together(
    service: TransactionService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fence and advice commit together or not at all: a failure after the advice was
    written on the fence's connection leaves the key processing under the same owner, no
    advice queued and nothing announced."""
    payment = _payment()
    record, _ = await _claimed(service, payment)
    owner = await _take_over(service, record)
    queue_advice = acquire.queue_advice

    async def queue_then_fail(*args: Any, **kwargs: Any) -> None:
        await queue_advice(*args, **kwargs)
        raise RuntimeError("failed after the advice was written")

    monkeypatch.setattr(acquire, "queue_advice", queue_then_fail)
    with pytest.raises(RuntimeError, match="failed after the advice was written"):
        await recovery.fence(service, record, owner)

    after = await service.read(record.merchant_id, record.key)
    assert after is not None
    assert (after.state, after.lease_token) == (store.PROCESSING, owner)
    assert await _advices(service, record) == []
    assert await _events(service, record, "transaction.aborted") == 0


# ----------------------------------------------- issue 14, the smaller ones (deterministic)
async def test_an_original_that_loses_its_final_write_to_a_take_over_answers_202(
    service: TransactionService, acquirer_host: AcquirerProcess
) -> None:
    """The original create's 0200 was answered, but its lease ran out before the final
    write and the completer took the key over (it is settling it now). The key is the
    server's to finish: 202 processing with Retry-After, not 409 'in progress' — and the
    approval it could not record is not written."""
    payment = _payment()
    record, auth = await _claimed(service, payment)
    await _lease_runs_out(service, record, 1)
    current = await service.read(record.merchant_id, record.key)
    assert current is not None
    await _take_over(service, current)  # Completer → recovery.recover: token 2, lease live

    late = await _final_write(service, record, payment, auth, token=1)
    assert late.status == 202, late.body
    # rendered with Retry-After
    assert late.idempotency_status == "in_progress" and late.retry_after
    assert b'"status":"processing"' in late.body
    assert await _transactions(service, record) == []
    after = await service.read(record.merchant_id, record.key)
    assert after is not None and (after.state, after.lease_token) == (store.PROCESSING, 2)
    _one_0200(acquirer_host, service, record)


async def test_an_abort_that_loses_its_take_over_to_a_completion_tells_the_truth(
    service: TransactionService,
) -> None:
    """The abort read the key processing (lease run out), then the owner's final write
    committed before the abort's take-over: the take-over fails on the token, and the abort
    must answer what happened (200, the approved transaction), not 409 — and queues no
    advice for an approval the ledger holds."""
    payment = _payment()
    record, auth = await _claimed(service, payment)
    await _lease_runs_out(service, record, 1)
    stale = await service.read(record.merchant_id, record.key)  # what the abort read
    assert stale is not None and stale.state == store.PROCESSING

    completed = await _final_write(service, record, payment, auth, token=1)  # in between
    assert completed.status == 201, completed.body

    answer = await resolution._abort_existing(service, stale)
    assert answer.status == 200, answer.body
    assert answer.event == "already_processed"
    assert b'"status":"approved"' in answer.body
    assert await _advices(service, record) == []
    assert await _events(service, record, "transaction.aborted") == 0
