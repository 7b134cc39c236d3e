"""Hostile review of the create's group commit (api/transactions/group_commit.py): claims and
finishes written many per transaction, on both backends, against the contract's create
guarantees (SPEC §2, §3, §8): one transaction and at most one 0200 per (merchant, key); a
503 only for a key with no claim; every 201 the key's stored transaction.

Each test forces the batch it attacks: the committer of the kind under test has one lane and
starts nothing (``Held``) until every create's write has queued, so they are written as one
batch, in a known order, whatever the machine's load.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TypeVar

import asyncpg
import pytest
from sqlalchemy import text

from api.acquirer.types import Authorization, AuthorizationRequest
from api.events.writer import RequestOutcome
from api.idempotency.keys import body_fingerprint
from api.storage_errors import storage_unavailable
from api.transactions.group_commit import GroupCommit
from api.transactions.outcome import IdempotencyStatus, Outcome
from api.transactions.schemas import TransactionCreate
from api.transactions.service import CLAIM_LOCK_TIMEOUT, TransactionService
from tests.support.backend import Backend
from tests.support.client import body, card
from tests.support.stalls import dsn, held_key, until_lock_waiters
from tests.support.transaction_service import ApprovingAcquirer, transaction_service

T = TypeVar("T")
M1 = "mer_gc_attack_1"
M2 = "mer_gc_attack_2"
POISON_AMOUNT = 777_777  # a finish of this amount fails on its own statement (a trigger)


@dataclass
class Create:
    merchant: str
    key: str
    payment: TransactionCreate

    @property
    def fingerprint(self) -> str:
        return body_fingerprint(self.payment)


def _create(merchant: str, key: str, amount: int) -> Create:
    payment = TransactionCreate.model_validate(body(amount=amount, card=card("tok_visa_4242")))
    return Create(merchant, key, payment)


def _service(backend: Backend, **overrides: object) -> TransactionService:
    """Approves every 0200 after a short pause; records each 0200 by RRN."""
    return transaction_service(backend, ApprovingAcquirer(pause=0.005), db_pool_size=8, **overrides)


@pytest.fixture
async def service(private_backend: Backend) -> AsyncIterator[TransactionService]:
    svc = _service(private_backend)
    try:
        yield svc
    finally:
        await svc.engine.dispose()


class Held(GroupCommit[T]):
    """A GroupCommit with one lane that starts nothing while held: the writes queued
    meanwhile go as one batch when it is released (no connection, no lock held meanwhile)."""

    held = True

    def _start(self) -> None:
        if not self.held:
            super()._start()

    async def release_when_queued(self, count: int, *, timeout_s: float = 30.0) -> None:
        for _ in range(int(timeout_s / 0.01)):
            if len(self._pending) >= count:
                break
            await asyncio.sleep(0.01)
        else:
            raise AssertionError(f"only {len(self._pending)} of {count} writes queued")
        self.held = False
        self._start()


async def _until(condition: Callable[[], bool], *, timeout_s: float = 30.0) -> None:
    for _ in range(int(timeout_s / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the condition never held")


async def _queued_in_order(
    service: TransactionService, committer: GroupCommit[object], creates: list[Create]
) -> asyncio.Future[list[Outcome]]:
    """Start the creates one by one, each once the previous one's write has queued: the
    batch holds them in this order."""
    tasks = []
    for n, c in enumerate(creates, start=1):
        tasks.append(asyncio.ensure_future(_go(service, c)))
        for _ in range(3000):
            if len(committer._pending) >= n:
                break
            await asyncio.sleep(0.01)
        else:
            raise AssertionError(f"create {n} never queued")
    return asyncio.gather(*tasks)


def _one_lane_claims(service: TransactionService) -> Held[bool]:
    postgres = service.engine.dialect.name == "postgresql"
    service.claims = Held(
        service.engine,
        kind="claim",
        lanes=1,
        max_lanes=1,
        prologue=CLAIM_LOCK_TIMEOUT if postgres else None,
        new_key=True,
    )
    return service.claims


def _one_lane_finishes(service: TransactionService) -> Held[str | None]:
    shipped = service.finishes  # its prologue (lock_timeout) and queue bound, one lane
    service.finishes = Held(
        service.engine,
        kind="finish",
        lanes=1,
        max_lanes=1,
        prologue=shipped.prologue,
        queue_timeout=shipped.queue_timeout,
    )
    return service.finishes


async def _rows(service: TransactionService) -> dict[tuple[str, str], tuple[str, int, int]]:
    """(merchant, key) → (key state, its transactions, its charge ledger entries)."""
    async with service.engine.connect() as conn:
        rows = (
            await conn.execute(
                text(
                    "SELECT k.merchant_id, k.key, k.state,"
                    ' (SELECT count(*) FROM "transaction" t WHERE t.merchant_id = k.merchant_id'
                    " AND t.id = k.key),"
                    " (SELECT count(*) FROM ledger_entry l WHERE l.merchant_id = k.merchant_id"
                    " AND l.transaction_id = k.key AND l.kind = 'charge')"
                    " FROM idempotency_key k"
                )
            )
        ).all()
    return {(r[0], r[1]): (r[2], int(r[3]), int(r[4])) for r in rows}


def _sent(service: TransactionService, merchant: str, key: str) -> int:
    acquirer = service.acquirer
    assert isinstance(acquirer, ApprovingAcquirer)
    return acquirer.sent[service.rrn(merchant, key)]


UNAVAILABLE = Outcome(503, b"", RequestOutcome.ERROR, IdempotencyStatus.NOT_FOUND)


async def _go(service: TransactionService, create: Create) -> Outcome:
    """The create's outcome; a storage error raised is what the route answers 503
    (``api.errors``), as ``UNAVAILABLE``."""
    try:
        return await service.create(create.merchant, create.key, create.payment, create.fingerprint)
    except Exception as exc:
        if not storage_unavailable(exc):
            raise
        return UNAVAILABLE


async def test_one_key_many_times_and_one_uuid_of_two_merchants_in_one_claim_batch(
    service: TransactionService,
) -> None:
    """Eight creates of one key (same body), three of the same UUID under another merchant,
    and the first merchant's second key twice with two bodies — all in ONE claim batch: the
    second INSERT of a key in the batch sees the first's uncommitted row (not claimed), so
    each (merchant, key) is claimed, sent and written once; the losers are answered 409 in
    flight (or the replay), the other body 422 — never 503, never a second 0200."""
    shared = str(uuid.uuid4())
    other = str(uuid.uuid4())
    creates = (
        [_create(M1, shared, 1234) for _ in range(8)]
        + [_create(M2, shared, 1234) for _ in range(3)]
        + [_create(M1, other, 500), _create(M1, other, 501)]
    )
    claims = _one_lane_claims(service)
    answers = asyncio.gather(*(_go(service, c) for c in creates))
    await claims.release_when_queued(len(creates))
    outcomes = await answers
    assert claims.batches == 1, claims.batches  # all of them in one transaction

    by_ident: dict[tuple[str, str], list[tuple[Create, Outcome]]] = {}
    for c, o in zip(creates, outcomes, strict=True):
        by_ident.setdefault((c.merchant, c.key), []).append((c, o))
    for (merchant, key), pairs in by_ident.items():
        created = [o for _c, o in pairs if o.event == RequestOutcome.CREATED]
        assert len(created) == 1 and created[0].status == 201, [
            (o.status, o.body) for _c, o in pairs
        ]
        for c, o in pairs:
            assert o.status in (201, 409, 422), (o.status, o.body)
            if o.status == 422:
                assert c.payment.amount != _body_amount(created[0])
        assert _sent(service, merchant, key) == 1, (merchant, key)
    rows = await _rows(service)
    assert rows == {
        (M1, shared): ("completed", 1, 1),
        (M2, shared): ("completed", 1, 1),
        (M1, other): ("completed", 1, 1),
    }


def _body_amount(outcome: Outcome) -> int:
    return int(json.loads(outcome.body)["amount"])


async def test_a_held_key_and_a_repeated_key_in_one_batch_written_again_without_the_held(
    private_pg_backend: Backend,
) -> None:
    """The batch [k, k, held, x1..x4]: the held key's INSERT waits past lock_timeout and rolls
    the batch back; written again without it, k is still claimed by its first create only
    (the second sees the first's row again), and everything else is written once."""
    service = _service(private_pg_backend)
    k = str(uuid.uuid4())
    held = _create(M1, str(uuid.uuid4()), 999)
    try:
        async with held_key(dsn(private_pg_backend), held.merchant, held.key) as holder:
            others = [_create(M1, str(uuid.uuid4()), 300 + n) for n in range(4)]
            creates = [_create(M1, k, 42), _create(M1, k, 42), held, *others]
            claims = _one_lane_claims(service)
            answers = await _queued_in_order(service, claims, creates)  # type: ignore[arg-type]
            await claims.release_when_queued(len(creates))
            outcomes = await answers
            await holder.release()
        statuses = [o.status for o in outcomes]
        assert sorted(statuses[:2]) == [201, 409], statuses
        assert statuses[2] == 409 and b"request_in_progress" in outcomes[2].body
        assert statuses[3:] == [201] * len(others), statuses
        assert _sent(service, M1, k) == 1 and _sent(service, M1, held.key) == 0
        rows = await _rows(service)
        assert (M1, held.key) not in rows
        assert rows[(M1, k)] == ("completed", 1, 1)
        assert all(rows[(M1, c.key)] == ("completed", 1, 1) for c in others)
    finally:
        await service.engine.dispose()


async def test_a_claim_batch_whose_backend_is_terminated_mid_batch_never_lies(
    private_pg_backend: Backend,
) -> None:
    """The batch [a1..a3, held, b1..b3] waits on the held key; its backend is terminated
    there (57P01, the session ended: the batch's end unseen). The a's and the held key had
    sent their INSERT: each reads its key back (absent: rolled back) and is answered 409 in
    flight — never 503 for what may have committed; the b's never sent theirs: 503, true
    (no row, no 0200). Every key sent again is then processed once."""
    service = _service(private_pg_backend)
    held = _create(M1, str(uuid.uuid4()), 999)
    admin = await asyncpg.connect(dsn(private_pg_backend))
    try:
        async with held_key(dsn(private_pg_backend), held.merchant, held.key) as holder:
            before = [_create(M1, str(uuid.uuid4()), 100 + n) for n in range(3)]
            after = [_create(M1, str(uuid.uuid4()), 200 + n) for n in range(3)]
            creates = [*before, held, *after]
            claims = _one_lane_claims(service)
            # long enough to be terminated while waiting on the held key
            claims.prologue = ("SET LOCAL lock_timeout = '20s'",)
            answers = await _queued_in_order(service, claims, creates)  # type: ignore[arg-type]
            await claims.release_when_queued(len(creates))
            waiting = await until_lock_waiters(
                admin, what="the batch waiting on the held key", within=20
            )
            assert await admin.fetchval("SELECT pg_terminate_backend($1)", waiting[0])
            outcomes = await answers
            statuses = [o.status for o in outcomes]
            assert statuses[:4] == [409] * 4, [(o.status, o.body[:80]) for o in outcomes]
            assert statuses[4:] == [503] * 3, statuses
            rows = await _rows(service)
            for c in creates:
                assert (c.merchant, c.key) not in rows
                assert _sent(service, c.merchant, c.key) == 0
            await holder.release()
        for c in creates:
            again = await _go(service, c)
            assert again.status == 201 and again.event == RequestOutcome.CREATED, again
        rows = await _rows(service)
        for c in creates:
            assert rows[(c.merchant, c.key)] == ("completed", 1, 1)
            assert _sent(service, c.merchant, c.key) == 1
    finally:
        await admin.close()
        await service.engine.dispose()


async def _poison(service: TransactionService, sqlstate: str) -> None:
    """A trigger failing the insert of a transaction of POISON_AMOUNT: one finish's own
    statement error (``sqlstate`` on Postgres; an ABORT constraint error on SQLite)."""
    async with service.engine.begin() as conn:
        if service.engine.dialect.name == "postgresql":
            await conn.exec_driver_sql(
                "CREATE FUNCTION gc_poison() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
                f" IF NEW.amount = {POISON_AMOUNT} THEN"
                f" RAISE EXCEPTION 'poisoned finish' USING ERRCODE = '{sqlstate}'; END IF;"
                " RETURN NEW; END $$"
            )
            await conn.exec_driver_sql(
                'CREATE TRIGGER gc_poison BEFORE INSERT ON "transaction"'
                " FOR EACH ROW EXECUTE FUNCTION gc_poison()"
            )
        else:
            await conn.exec_driver_sql(
                'CREATE TRIGGER gc_poison BEFORE INSERT ON "transaction"'
                f" WHEN NEW.amount = {POISON_AMOUNT}"
                " BEGIN SELECT RAISE(ABORT, 'poisoned finish'); END"
            )


async def _finish_batch_with(service: TransactionService, creates: list[Create]) -> list[Outcome]:
    finishes = _one_lane_finishes(service)
    answers = await _queued_in_order(service, finishes, creates)  # type: ignore[arg-type]
    await finishes.release_when_queued(len(creates))
    return list(await answers)


async def test_a_statement_error_in_one_finish_spares_its_batch_mates(
    service: TransactionService,
) -> None:
    """One finish of a batch of six fails on its own statement (a bug-like error): it alone
    is answered 202 (its key left processing for the completer, nothing half written); the
    five others are written again without it and answered 201, each once."""
    await _poison(service, "P0001")
    creates = [_create(M1, str(uuid.uuid4()), 600 + n) for n in range(5)]
    poisoned = _create(M1, str(uuid.uuid4()), POISON_AMOUNT)
    creates.insert(2, poisoned)
    outcomes = await _finish_batch_with(service, creates)
    statuses = [o.status for o in outcomes]
    assert statuses == [201, 201, 202, 201, 201, 201], [(o.status, o.body) for o in outcomes]
    rows = await _rows(service)
    assert rows[(M1, poisoned.key)] == ("processing", 0, 0)
    for c in creates:
        assert _sent(service, c.merchant, c.key) == 1
        if c is not poisoned:
            assert rows[(c.merchant, c.key)] == ("completed", 1, 1)


async def test_a_create_cancelled_while_its_claim_is_queued_writes_nothing(
    service: TransactionService,
) -> None:
    """A create whose task is cancelled (its request gone) while its claim waits for a lane:
    the claim is left out of the batch — no row, no 0200 — and its batch-mates are written;
    the key sent again is processed once."""
    gone = _create(M1, str(uuid.uuid4()), 321)
    mates = [_create(M1, str(uuid.uuid4()), 330 + n) for n in range(3)]
    claims = _one_lane_claims(service)
    tasks = []
    for n, c in enumerate([mates[0], gone, mates[1], mates[2]], start=1):
        tasks.append(asyncio.ensure_future(_go(service, c)))
        await _until(lambda n=n: len(claims._pending) >= n)  # type: ignore[misc]
    tasks[1].cancel()  # its request gone while its claim waits for a lane
    await asyncio.sleep(0)
    await claims.release_when_queued(4)
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(results[1], asyncio.CancelledError), results
    assert [r.status for r in results if isinstance(r, Outcome)] == [201] * 3, results
    rows = await _rows(service)
    assert (gone.merchant, gone.key) not in rows and _sent(service, M1, gone.key) == 0
    for c in mates:
        assert rows[(c.merchant, c.key)] == ("completed", 1, 1)
    again = await _go(service, gone)
    assert again.status == 201 and again.event == RequestOutcome.CREATED
    assert _sent(service, M1, gone.key) == 1


class HeldSaleAcquirer(ApprovingAcquirer):
    """Approves at once, except the 0200 of ``rrn``: it says so (``sent``) and answers once
    ``go`` is set — by then an operator holds that key's row."""

    def __init__(self, rrn: str) -> None:
        super().__init__(pause=0.005)
        self.rrn = rrn
        self.out = asyncio.Event()
        self.go = asyncio.Event()

    async def authorize(self, req: AuthorizationRequest, *, timeout_s: float) -> Authorization:
        if req.rrn == self.rrn:
            self.out.set()
            await self.go.wait()
        return await super().authorize(req, timeout_s=timeout_s)


async def test_a_key_held_by_an_operator_does_not_hold_its_finish_batch_mates(
    private_pg_backend: Backend,
) -> None:
    """X's claim is committed and its 0200 out when an operator's open transaction takes X's
    row (``UPDATE … WHERE key = X``, not committed). X's finish and four other creates'
    finishes are then written as one batch: X's UPDATE waits on the operator. The other four
    keys have their acquirer's approval and nothing of theirs is held: as with a
    transaction of their own, each must be written (completed, one transaction) — at the
    latest, once its lease has run out, settled — while X alone waits for the operator."""
    x = _create(M1, str(uuid.uuid4()), 4242)
    others = [_create(M1, str(uuid.uuid4()), 700 + n) for n in range(4)]
    acquirer = HeldSaleAcquirer("")
    service = transaction_service(
        private_pg_backend,
        acquirer,
        db_pool_size=8,
        answer_within=0.5,
        acquirer_timeout=1.0,
        lease_seconds=1.0,  # leases of 2 s
    )
    acquirer.rrn = service.rrn(x.merchant, x.key)
    operator = await asyncpg.connect(dsn(private_pg_backend))
    held = operator.transaction()
    try:
        finishes = _one_lane_finishes(service)
        creates = [others[0], others[1], x, others[2], others[3]]
        answers = asyncio.gather(*(_go(service, c) for c in creates))
        await asyncio.wait_for(acquirer.out.wait(), 30)  # X claimed, its 0200 out
        await held.start()
        await operator.execute(
            "UPDATE idempotency_key SET updated_at = updated_at"
            " WHERE merchant_id = $1 AND key = $2",
            x.merchant,
            x.key,
        )
        acquirer.go.set()
        await finishes.release_when_queued(len(creates))
        outcomes = await answers
        assert [o.status for o in outcomes] in ([202] * 5, [201, 201, 202, 201, 201]), outcomes
        await asyncio.sleep(3.0)  # past every lease (2 s)
        rows = await _rows(service)
        stuck = [c.key for c in others if rows[(c.merchant, c.key)][0] == "processing"]
        assert rows[(x.merchant, x.key)][0] == "processing"  # X waits for the operator
        assert not stuck, f"{len(stuck)} keys nobody holds stuck processing past their lease"
    finally:
        await held.rollback()
        await operator.close()
        await asyncio.sleep(0.5)
        await service.drain(5)
        await service.engine.dispose()
