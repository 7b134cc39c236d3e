"""A guarded claim whose commit acknowledgement is lost keeps the cashier's override.

With the merchant's duplicate guard on, the claim is a transaction of its own
(``TransactionService._claim``, guard path). When the guard finds a suspect and the cashier
overrode it (``allow_duplicate``), the claimed key's stored request carries the override and
the transaction must record ``duplicate_override = true``. If that claim's commit is
acknowledged, it does; if its acknowledgement is lost, ``_claim_unseen`` reads the key back
and drives it with the body its claim stored — it drove the body as it was *before* the
override (the guard cleared the field), and the transaction recorded no override although
the stored request did.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import pytest
from sqlalchemy import text

from api.transactions import service as service_module
from tests.support.backend import Backend
from tests.support.transaction_service import ApprovingAcquirer, new_payment, transaction_service

MERCHANT = "mer_guard_unseen"
GUARD_S = 600


def _claim_acknowledgement_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    """The guarded claim's transaction commits, then its connection is lost before the
    answer arrives: its end is unseen."""
    real = service_module.atomic

    @asynccontextmanager
    async def lost(engine: Any, *, new_key: bool = False) -> AsyncIterator[Any]:
        async with real(engine, new_key=new_key) as conn:
            yield conn
        if new_key:
            raise asyncpg.exceptions.ConnectionDoesNotExistError("connection lost after COMMIT")

    monkeypatch.setattr(service_module, "atomic", lost)


@pytest.mark.parametrize("ack_lost", [False, True], ids=["ack_seen", "ack_lost"])
async def test_an_overridden_guarded_claim_records_the_override(
    private_pg_backend: Backend, monkeypatch: pytest.MonkeyPatch, ack_lost: bool
) -> None:
    acquirer = ApprovingAcquirer()
    service = transaction_service(private_pg_backend, acquirer)
    try:
        first_key, first, first_fp = new_payment(4321)
        done = await service.create(MERCHANT, first_key, first, first_fp, guard_s=GUARD_S)
        assert done.status == 201, done
        # the same card, amount and terminal again: the guard's suspect; the cashier confirmed
        again = first.model_copy(update={"allow_duplicate": True})
        key = str(uuid.uuid4())
        if ack_lost:
            _claim_acknowledgement_lost(monkeypatch)
        outcome = await service.create(
            MERCHANT, key, again, service.fingerprint_of(again), guard_s=GUARD_S
        )
        monkeypatch.undo()
        assert outcome.status == 201, outcome
        assert acquirer.sent[service.rrn(MERCHANT, key)] == 1
        async with service.engine.connect() as conn:
            override = (
                await conn.execute(
                    text(
                        'SELECT duplicate_override FROM "transaction" '
                        "WHERE merchant_id = :m AND id = :k"
                    ),
                    {"m": MERCHANT, "k": key},
                )
            ).scalar_one()
        assert override is True
    finally:
        await service.drain(5)
        await service.engine.dispose()
