"""Two server processes' claims of one key and body in the same microsecond, both commit
acknowledgements lost: only the claim the row is drives the key — one 0200 (contract §2.9,
"at most one 0200 per key, ever").

A claim whose end was unseen is read back and taken for ours only if the row has our
fingerprint, our claim time and our lease end. Claim times are unique within one process
(test_group_commit.py), not across processes: the lease end carries a random mark
(``TransactionService._lease_until``) that tells two processes' claims of one moment apart.
Two ``TransactionService``s on one database stand for two server processes; the wall clock
is frozen, so both claim at the same microsecond.
"""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import text

from api.transactions import service as service_module
from tests.support.backend import Backend
from tests.support.transaction_service import (
    ApprovingAcquirer,
    lose_claim_acknowledgements,
    new_payment,
    transaction_service,
)

MERCHANT = "mer_claim_mark"


async def test_two_processes_claims_of_one_microsecond_send_one_0200(
    private_pg_backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    acquirer = ApprovingAcquirer(pause=0.005)
    first = transaction_service(private_pg_backend, acquirer)
    second = transaction_service(private_pg_backend, acquirer)
    frozen = service_module.utcnow()
    monkeypatch.setattr(service_module, "utcnow", lambda: frozen)
    for service in (first, second):
        lose_claim_acknowledgements(service)
    try:
        for round_ in range(5):
            key, payment, fp = new_payment(700 + round_)
            outcomes = await asyncio.gather(
                first.create(MERCHANT, key, payment, fp),
                second.create(MERCHANT, key, payment, fp),
            )
            assert acquirer.sent[first.rrn(MERCHANT, key)] == 1, acquirer.rrns
            # the other create answers from the key: in flight, or the stored response
            answered = [outcome.body for outcome in outcomes if outcome.status == 201]
            assert answered and len(set(answered)) == 1, outcomes
            assert {outcome.status for outcome in outcomes} <= {201, 202, 409}, outcomes
        async with first.engine.connect() as conn:
            transactions = (
                await conn.execute(
                    text('SELECT count(*) FROM "transaction" WHERE merchant_id = :m'),
                    {"m": MERCHANT},
                )
            ).scalar_one()
        assert transactions == 5
        assert len(acquirer.rrns) == 5
    finally:
        for service in (first, second):
            await service.drain(5)
            await service.engine.dispose()
