"""A create reads its key before it claims it, on every backend: a repeat of a stored key is
answered from its row and never joins the batch of claims (test_repeats_of_stored_keys.py
says why). With it: a repeat answers from its row (the replay, 422 for another body) even
when its body's times would now be refused, and concurrent repeats of a fresh key send one
0200. ``TransactionService.read`` is watched, not replaced."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from api.db import utcnow
from api.transactions.schemas import TransactionCreate
from api.transactions.service import TransactionService
from tests.support.backend import Backend
from tests.support.transaction_service import ApprovingAcquirer, new_payment, running_service

MERCHANT = "mer_claim_first"


def _count_reads(service: TransactionService, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    reads: list[str] = []
    read = service.read

    async def counted(merchant_id: str, key: str):  # type: ignore[no-untyped-def]
        reads.append(key)
        return await read(merchant_id, key)

    monkeypatch.setattr(service, "read", counted)
    return reads


async def test_a_fresh_key_is_read_before_its_claim_and_a_repeat_answers_from_its_row(
    private_backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    acquirer = ApprovingAcquirer()
    async with running_service(private_backend, acquirer) as service:
        reads = _count_reads(service, monkeypatch)
        key, payment, fp = new_payment(1250)
        first = await service.create(MERCHANT, key, payment, fp)
        assert first.status == 201, first
        assert reads == [key]  # looked up first: absent, then claimed

        reads.clear()
        again = await service.create(MERCHANT, key, payment, fp)
        assert (again.status, again.body) == (201, first.body)  # the stored answer, replayed
        assert reads == [key]  # read once, and answered from the row: no claim tried

        other = TransactionCreate.model_validate(
            {**payment.model_dump(mode="json", exclude_none=True), "amount": 1251}
        )
        refused = await service.create(MERCHANT, key, other, service.fingerprint_of(other))
        assert refused.status == 422, refused
        assert acquirer.sent[service.rrn(MERCHANT, key)] == 1
        await service.drain(5)


async def test_a_repeat_whose_body_is_now_too_old_still_answers_from_its_row(
    private_pg_backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The key exists; the same body, repeated once its captured_at has passed the tombstone
    window, is the stored answer — not the fence a fresh key that old gets."""
    acquirer = ApprovingAcquirer()
    async with running_service(private_pg_backend, acquirer, tombstone_retention=3600) as service:
        key, payment, fp = new_payment(1300)
        payment = payment.model_copy(update={"captured_at": utcnow() - timedelta(seconds=60)})
        fp = service.fingerprint_of(payment)
        first = await service.create(MERCHANT, key, payment, fp)
        assert first.status == 201, first
        service.settings.tombstone_retention = 30  # the body is now older than the window
        again = await service.create(MERCHANT, key, payment, fp)
        assert (again.status, again.body) == (201, first.body)
        assert acquirer.sent[service.rrn(MERCHANT, key)] == 1
        await service.drain(5)


async def test_concurrent_repeats_of_a_fresh_key_send_one_0200(private_pg_backend: Backend) -> None:
    acquirer = ApprovingAcquirer(pause=0.05)
    async with running_service(private_pg_backend, acquirer) as service:
        for round_ in range(3):
            key, payment, fp = new_payment(1400 + round_)
            outcomes = await asyncio.gather(
                *(service.create(MERCHANT, key, payment, fp) for _ in range(12))
            )
            assert acquirer.sent[service.rrn(MERCHANT, key)] == 1, acquirer.rrns
            created = [outcome for outcome in outcomes if outcome.status == 201]
            assert created and len({outcome.body for outcome in created}) == 1, outcomes
            assert {outcome.status for outcome in outcomes} <= {201, 409}, outcomes
        await service.drain(5)
