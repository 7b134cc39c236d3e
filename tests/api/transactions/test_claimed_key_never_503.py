"""A create about a key whose row exists is never answered 503 ("nothing was processed"):
once a claim is durable — ours, with its 0200 possibly gone, or another create's — a storage
error on the way to the answer is 202 (the server finishes the key) or 409 in flight (look it
up), never 503 (contract §2: 503 is kept for keys with no claim at all).

Reproduced in CI by ``test_unknown_outcome_cluster[kill]`` (one claimed key answered 503
among eight cluster crashes under load): the create's finish met a lease taken over by the
completer after the database came back, and the read of the key that should have told the
truth met the next crash — its storage error went up as a 503. Here the same two steps are
forced on a real PostgreSQL database: the acquirer's side (the network peer) takes the
lease over as the completer would, and the one key read after it fails as a crash would
make it fail. Then a create whose claim waits on another create's uncommitted row
(``lock_timeout``) and whose read of the key then fails: 409, not 503.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from api.acquirer.types import AuthorizationRequest
from api.storage_errors import StorageUnavailableError
from api.transactions.service import TransactionService
from tests.support.backend import Backend
from tests.support.stalls import dsn, held_key
from tests.support.transaction_service import ApprovingAcquirer, new_payment, running_service

MERCHANT = "mer_claimed_never_503"


class ReadFault:
    """The service's key reads fail while ``armed`` (as during a crash of the database);
    the writes and everything else are untouched."""

    def __init__(self, service: TransactionService) -> None:
        self.armed = False
        self.failed = 0
        self._read = service.read

        async def read(merchant_id: str, key: str) -> Any:
            if self.armed:
                self.failed += 1
                raise StorageUnavailableError("the database is restarting (injected)")
            return await self._read(merchant_id, key)

        service.read = read  # type: ignore[method-assign]


class TakeoverAcquirer(ApprovingAcquirer):
    """Approves every 0200 — after taking the key's lease over in the database (what the
    completer does to a key whose owner looks gone) and arming the read fault."""

    def __init__(self, dsn: str) -> None:
        super().__init__()
        self.dsn = dsn
        self.fault: ReadFault | None = None

    async def before_approval(self, req: AuthorizationRequest) -> None:
        conn = await asyncpg.connect(self.dsn)
        try:
            taken = await conn.execute(
                "UPDATE idempotency_key SET lease_token = lease_token + 1"
                " WHERE merchant_id = $1 AND state = 'processing'",
                MERCHANT,
            )
        finally:
            await conn.close()
        assert taken == "UPDATE 1", taken
        assert self.fault is not None
        self.fault.armed = True


@pytest.fixture
async def service(private_pg_backend: Backend) -> AsyncIterator[TransactionService]:
    acquirer = TakeoverAcquirer(dsn(private_pg_backend))
    async with running_service(private_pg_backend, acquirer, db_pool_size=2) as service:
        yield service


async def test_a_lost_lease_then_an_unreadable_key_is_202_not_503(
    service: TransactionService,
) -> None:
    acquirer = service.acquirer
    assert isinstance(acquirer, TakeoverAcquirer)
    acquirer.fault = fault = ReadFault(service)
    key, payment, fingerprint = new_payment(1250)
    outcome = await service.create(MERCHANT, key, payment, fingerprint)
    assert acquirer.rrns, "the 0200 left"
    assert fault.failed >= 1, "the read after the lost lease met the fault"
    assert outcome.status == 202, (outcome.status, outcome.body)
    fault.armed = False
    record = await service.must_read(MERCHANT, key)
    assert record.state == "processing"  # its new owner (the completer) settles it


async def test_a_held_key_whose_read_fails_is_409_not_503(
    service: TransactionService, private_pg_backend: Backend
) -> None:
    fault = ReadFault(service)
    key, payment, fingerprint = new_payment(990)
    # another create's claim, not committed yet
    async with held_key(dsn(private_pg_backend), MERCHANT, key) as held:
        original = fault._read

        async def first_read_then_fail(merchant_id: str, key: str) -> Any:
            try:
                return await original(merchant_id, key)
            finally:
                fault.armed = True  # every read after the create's first one fails

        fault._read = first_read_then_fail
        outcome = await asyncio.wait_for(service.create(MERCHANT, key, payment, fingerprint), 30)
        assert fault.failed == 1, "the read after the lock timeout met the fault"
        assert outcome.status == 409, (outcome.status, outcome.body)
        assert b"request_in_progress" in outcome.body
        await held.release()
    assert service.acquirer.rrns == []  # type: ignore[attr-defined]
