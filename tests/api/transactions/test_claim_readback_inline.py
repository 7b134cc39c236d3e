"""A claim's read-back after an unseen end, through the server's own hot
read (``PgInline``: raw asyncpg on the hot pool), with the wall clock stepped back between
claims. Our own claim must be recognised as ours after the round trip of its claim time and
lease end (timestamptz, microseconds), so it is driven (one 0200), and a stepped-back clock
must not make two claims of one key and body in one process look alike."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from api.db import create_engine
from api.main import hot_reads
from api.transactions import service as service_module
from api.transactions.service import TransactionService
from tests.support.backend import Backend
from tests.support.transaction_service import (
    ApprovingAcquirer,
    lose_claim_acknowledgements,
    new_payment,
    service_settings,
)

MERCHANT = "mer_claim_readback"


async def test_our_claim_read_back_inline_with_the_clock_stepped_back(
    private_pg_backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = service_settings(private_pg_backend)
    acquirer = ApprovingAcquirer(pause=0.005)
    service = TransactionService(
        create_engine(settings), acquirer, settings, inline=hot_reads(settings)
    )
    lose_claim_acknowledgements(service)
    real = service_module.utcnow
    offset = [timedelta(0)]
    monkeypatch.setattr(service_module, "utcnow", lambda: real() + offset[0])
    try:
        for round_ in range(6):
            offset[0] = -timedelta(seconds=round_ % 2)  # a clock stepped back 1 s, and forth
            key, payment, fp = new_payment(900 + round_)
            outcomes = await asyncio.gather(
                *(service.create(MERCHANT, key, payment, fp) for _ in range(3))
            )
            assert acquirer.sent[service.rrn(MERCHANT, key)] == 1, outcomes
            assert sum(o.status == 201 for o in outcomes) >= 1, outcomes
            assert {o.status for o in outcomes} <= {201, 409}, outcomes
    finally:
        await service.drain(5)
        assert service.inline is not None
        await service.inline.close()
        await service.engine.dispose()
