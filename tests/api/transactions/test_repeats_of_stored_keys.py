"""Repeats of a stored key, on PostgreSQL: a create reads its key before it claims it, so a
repeat is answered from the committed row and never joins the batch of claims
(``TransactionService._create_in_phases``; a claim-first variant, which let the claim's
``INSERT … ON CONFLICT DO NOTHING`` tell whether the key existed, failed the first test here).

What they must keep (SPEC §2, §3):

- a repeat of a key whose row another transaction is updating (an operator's open
  ``BEGIN; UPDATE idempotency_key …``, a backfill during a rolling deploy) is answered from its
  committed row, without joining the batch of claims. In a batch's ``INSERT`` it would wait on
  that updater (``ON CONFLICT DO NOTHING`` waits for an in-progress updater of the
  conflicting row) until ``lock_timeout`` (250 ms), and the batch would be written again one
  claim at a time — each held repeat costing its batch-mates another lock timeout. Fresh
  creates batched with them must not be stalled
  much beyond the lock timeout (test_held_keys bounds an unrelated create at 2 s with a
  whole worker's connections held; here ~1 s with a 250 ms lock timeout);
- a repeat of a key whose lease expired takes it over exactly once, settles it in doubt
  (declined / acquirer_timeout, one 0420 queued) and never sends a 0200 for it (§2.9, §3.3);
- a repeat of a fenced key (aborted; expired tombstone) is 410 and sends nothing;
- a repeat with another body while the key is in flight is 422 ``idempotency_key_reused``
  (``Idempotency-Status: in_progress``), the same body 409, and the owner still sends one 0200;
- a replay's request event is ``replayed``, never ``created``.

Each test runs a ``TransactionService`` in the test's loop (fake acquirer) on a private
PostgreSQL database.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import Counter
from datetime import timedelta

import asyncpg

from api.db import utcnow
from api.events.writer import RequestOutcome
from api.transactions import resolution
from api.transactions.outcome import Outcome
from api.transactions.schemas import TransactionCreate
from tests.support.backend import Backend
from tests.support.stalls import dsn, held
from tests.support.transaction_service import (
    ApprovingAcquirer,
    claim_key,
    new_payment,
    running_service,
)

MERCHANT = "mer_claim_first_review"


async def _timed(coro: object) -> tuple[Outcome, float]:
    started = time.monotonic()
    outcome = await coro  # type: ignore[misc]
    return outcome, time.monotonic() - started


def _other_body(payment: TransactionCreate, **changes: object) -> TransactionCreate:
    return TransactionCreate.model_validate(
        {**payment.model_dump(mode="json", exclude_none=True), **changes}
    )


async def test_repeats_of_rows_being_updated_do_not_stall_fresh_creates_batched_with_them(
    private_pg_backend: Backend,
) -> None:
    """Eight completed keys whose rows an operator's open transaction is updating are
    repeated (the terminals retrying) at the same moment as eight fresh creates. Every
    repeat is its replay (the committed answer, readable without waiting), and every fresh
    create is claimed and answered 201 within ~1 s — as read-first did in milliseconds: the
    repeats never joined the batch of claims there."""
    acquirer = ApprovingAcquirer()
    async with running_service(private_pg_backend, acquirer) as service:
        done = [new_payment(2000 + n) for n in range(8)]
        firsts = [await service.create(MERCHANT, key, p, fp) for key, p, fp in done]
        assert [first.status for first in firsts] == [201] * len(done), firsts
        fresh = [new_payment(3000 + n) for n in range(len(done) + 1)]

        updating = (
            "UPDATE idempotency_key SET updated_at = updated_at"
            " WHERE merchant_id = $1 AND key = ANY($2::varchar[])"
        )
        keys = [key for key, _p, _fp in done]
        async with held(dsn(private_pg_backend), updating, MERCHANT, keys):
            calls = [_timed(service.create(MERCHANT, *fresh[0]))]
            for (key, p, fp), new in zip(done, fresh[1:], strict=True):
                calls.append(_timed(service.create(MERCHANT, key, p, fp)))
                calls.append(_timed(service.create(MERCHANT, *new)))
            answers = await asyncio.wait_for(asyncio.gather(*calls), 60)

        repeats = answers[1::2]
        news = [answers[0], *answers[2::2]]
        for first, (replay, waited) in zip(firsts, repeats, strict=True):
            assert (replay.status, replay.body) == (201, first.body), (replay, waited)
            assert replay.event == RequestOutcome.REPLAYED, replay
            assert replay.headers.get("Idempotent-Replayed") == "true", replay
        assert [outcome.status for outcome, _ in news] == [201] * len(fresh), news
        assert all(outcome.event == RequestOutcome.CREATED for outcome, _ in news), news
        for key, _p, _fp in [*done, *fresh]:
            assert acquirer.sent[service.rrn(MERCHANT, key)] == 1, acquirer.rrns
        slowest = max(waited for _outcome, waited in news)
        # read-first: ~0.02 s; one held repeat in a batch costs it ~0.5 s (two lock
        # timeouts: the batch's INSERT, then the repeat's own); eight must not cost 8 × 0.25 s
        assert slowest < 1.0, (
            f"fresh creates batched with repeats of updated rows waited {slowest:.2f} s",
            sorted(round(waited, 2) for _outcome, waited in news),
        )
        await service.drain(5)


async def test_concurrent_repeats_of_expired_leases_take_each_over_once_and_send_no_0200(
    private_pg_backend: Backend,
) -> None:
    """Keys claimed by a create that vanished (lease run out, its 0200 possibly gone) are
    repeated six times each, at once, among fresh creates in the same batches of claims: each
    expired key is taken over by exactly one repeat, settled declined / acquirer_timeout with
    one 0420 queued, never sent a 0200; every other repeat answers 409 or the replay of that
    settlement; each fresh key is sent one 0200."""
    acquirer = ApprovingAcquirer(pause=0.02)
    async with running_service(private_pg_backend, acquirer) as service:
        expired = [new_payment(4000 + n) for n in range(4)]
        for key, payment, _fp in expired:
            await claim_key(
                service, MERCHANT, key, payment, now=utcnow() - timedelta(seconds=30), lease_s=1
            )
        fresh = [new_payment(5000 + n) for n in range(12)]
        calls = []
        for round_ in range(6):
            for key, payment, fp in expired:
                calls.append(service.create(MERCHANT, key, payment, fp))
            calls.extend(
                service.create(MERCHANT, *new) for new in fresh[2 * round_ : 2 * round_ + 2]
            )
        outcomes = await asyncio.wait_for(asyncio.gather(*calls), 60)

        by_key: dict[str, list[Outcome]] = {}
        position = 0
        for round_ in range(6):
            for key, _p, _fp in expired:
                by_key.setdefault(key, []).append(outcomes[position])
                position += 1
            for key, _p, _fp in fresh[2 * round_ : 2 * round_ + 2]:
                by_key.setdefault(key, []).append(outcomes[position])
                position += 1

        for key, _p, _fp in expired:
            answers = by_key[key]
            assert acquirer.sent[service.rrn(MERCHANT, key)] == 0, acquirer.rrns
            assert {a.status for a in answers} <= {201, 409}, answers
            created = [a for a in answers if a.event == RequestOutcome.CREATED]
            assert len(created) == 1, answers  # one takeover, one settlement
            settled = json.loads(created[0].body)
            assert (settled["status"], settled["decline_reason"]) == (
                "declined",
                "acquirer_timeout",
            ), settled
            for answer in answers:
                if answer.status == 201:
                    assert answer.body == created[0].body, answer
                if answer.status == 201 and answer is not created[0]:
                    assert answer.event == RequestOutcome.REPLAYED, answer
        for key, _p, _fp in fresh:
            assert acquirer.sent[service.rrn(MERCHANT, key)] == 1, acquirer.rrns
            assert [a.status for a in by_key[key]] == [201], by_key[key]

        conn = await asyncpg.connect(dsn(private_pg_backend))
        try:
            rows = await conn.fetch(
                'SELECT id, count(*) AS n FROM "transaction" WHERE merchant_id = $1 GROUP BY id',
                MERCHANT,
            )
            advices = await conn.fetch(
                "SELECT key, kind FROM acquirer_advice WHERE merchant_id = $1", MERCHANT
            )
        finally:
            await conn.close()
        assert {row["id"]: row["n"] for row in rows} == {
            key: 1 for key, _p, _fp in [*expired, *fresh]
        }
        assert Counter((row["key"], row["kind"]) for row in advices) == Counter(
            (key, "timeout") for key, _p, _fp in expired
        )
        await service.drain(5)


async def test_repeats_of_fenced_keys_are_410_and_send_nothing(
    private_pg_backend: Backend,
) -> None:
    """An aborted key, and a key fenced ``expired`` (its first create was too old), repeated
    with bodies the time checks pass — so the claim finds the tombstone, not a read — many
    times at once: 410 with the tombstone's code, nothing sent, the tombstone unchanged."""
    acquirer = ApprovingAcquirer()
    async with running_service(private_pg_backend, acquirer, tombstone_retention=3600) as service:
        aborted_key, payment, fp = new_payment(6000)
        fence = await resolution.abort(service, MERCHANT, aborted_key)
        assert fence.status == 200, fence

        expired_key, old, _ = new_payment(6001)
        old = old.model_copy(update={"captured_at": utcnow() - timedelta(hours=2)})
        first = await service.create(MERCHANT, expired_key, old, service.fingerprint_of(old))
        assert first.status == 410 and json.loads(first.body)["code"] == "request_expired"
        recent = old.model_copy(update={"captured_at": utcnow() - timedelta(seconds=5)})
        fresh = [new_payment(6100 + n) for n in range(4)]

        calls = []
        for _ in range(6):
            calls.append(service.create(MERCHANT, aborted_key, payment, fp))
            calls.append(
                service.create(MERCHANT, expired_key, recent, service.fingerprint_of(recent))
            )
        calls.extend(service.create(MERCHANT, *new) for new in fresh)
        outcomes = await asyncio.wait_for(asyncio.gather(*calls), 60)

        for outcome in outcomes[0:12:2]:
            assert outcome.status == 410, outcome
            assert json.loads(outcome.body)["code"] == "transaction_aborted", outcome
            assert outcome.idempotency_status == "aborted", outcome
        for outcome in outcomes[1:12:2]:
            assert (outcome.status, outcome.body) == (410, first.body), outcome
            assert outcome.idempotency_status == "expired", outcome
        assert [outcome.status for outcome in outcomes[12:]] == [201] * len(fresh)
        assert acquirer.sent[service.rrn(MERCHANT, aborted_key)] == 0
        assert acquirer.sent[service.rrn(MERCHANT, expired_key)] == 0
        aborted = await service.read(MERCHANT, aborted_key)
        still = await service.read(MERCHANT, expired_key)
        assert aborted is not None and aborted.state == "aborted"
        assert still is not None and still.state == "expired"
        await service.drain(5)


class GatedAcquirer(ApprovingAcquirer):
    """Approves each 0200 once ``gate`` is set: the key stays in flight meanwhile."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.out = asyncio.Event()

    async def before_approval(self, req: object) -> None:
        self.out.set()
        await self.gate.wait()


async def test_a_repeat_in_flight_is_409_or_422_and_the_owner_sends_one_0200(
    private_pg_backend: Backend,
) -> None:
    """While the key's 0200 is out (claim committed, lease live): the same body is 409
    ``request_in_progress``, another body is 422 ``idempotency_key_reused`` with
    ``Idempotency-Status: in_progress`` — many at once, with fresh creates in their batches;
    nothing of them is stored; the owner's answer is the one 201, and afterwards both
    bodies get the replay / 422 ``processed``."""
    acquirer = GatedAcquirer()
    async with running_service(private_pg_backend, acquirer) as service:
        key, payment, fp = new_payment(7000)
        other = _other_body(payment, amount=7001)
        other_fp = service.fingerprint_of(other)
        owner = asyncio.create_task(service.create(MERCHANT, key, payment, fp))
        await asyncio.wait_for(acquirer.out.wait(), 10)
        fresh_keys = [str(uuid.uuid4()) for _ in range(4)]
        calls = []
        for _ in range(5):
            calls.append(service.create(MERCHANT, key, payment, fp))
            calls.append(service.create(MERCHANT, key, other, other_fp))
        # fresh creates in the same batches of claims; their 0200s wait at the gate too
        news = asyncio.gather(*(service.create(MERCHANT, k, payment, fp) for k in fresh_keys))
        # the repeats are answered while the owner's 0200 is still out (the gate closed)
        outcomes = await asyncio.wait_for(asyncio.gather(*calls), 30)
        record = await service.read(MERCHANT, key)
        assert record is not None and record.state == "processing" and record.lease_token == 1
        assert not owner.done()
        acquirer.gate.set()
        created = await asyncio.wait_for(news, 60)
        first = await asyncio.wait_for(owner, 60)

        assert first.status == 201 and first.event == RequestOutcome.CREATED, first
        for same in outcomes[0::2]:
            assert same.status == 409, same
            assert json.loads(same.body)["code"] == "request_in_progress", same
            assert same.event == RequestOutcome.IN_PROGRESS, same
            assert same.idempotency_status == "in_progress", same
        for reused in outcomes[1::2]:
            assert reused.status == 422, reused
            assert json.loads(reused.body)["code"] == "idempotency_key_reused", reused
            assert reused.event == RequestOutcome.KEY_REUSED, reused
            assert reused.idempotency_status == "in_progress", reused
        assert [o.status for o in created] == [201] * len(fresh_keys), created
        assert acquirer.sent[service.rrn(MERCHANT, key)] == 1, acquirer.rrns
        for k in fresh_keys:
            assert acquirer.sent[service.rrn(MERCHANT, k)] == 1, acquirer.rrns

        replay = await service.create(MERCHANT, key, payment, fp)
        assert (replay.status, replay.body, replay.event) == (
            201,
            first.body,
            RequestOutcome.REPLAYED,
        )
        late = await service.create(MERCHANT, key, other, other_fp)
        assert (late.status, late.idempotency_status) == (422, "processed"), late
        assert acquirer.sent[service.rrn(MERCHANT, key)] == 1, acquirer.rrns
        await service.drain(5)
