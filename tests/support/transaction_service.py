"""The create's service in the test's own event loop (no server): a ``TransactionService`` on a
private backend, a fake acquirer that approves every 0200, and payments to send it.

``transaction_service(backend, acquirer, **settings)`` is the service (its engine disposed by
the caller, or by ``running_service`` at the exit of its ``async with``); ``private_engine``
the same settings' engine alone (for a ``GroupCommit`` of the test's own). Every one runs
without Redis, with the settings the test names on top of its backend's.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from typing import Any

import asyncpg
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from api.acquirer.types import Authorization, AuthorizationRequest, ReversalRequest
from api.config import Settings
from api.db import atomic, create_engine
from api.idempotency import store
from api.idempotency.keys import body_fingerprint
from api.transactions.schemas import TransactionCreate
from api.transactions.service import TransactionService
from tests.support.backend import Backend
from tests.support.client import body, card

APPROVED = Authorization(
    approved=True,
    authorization_code="A00001",
    decline_reason=None,
    response_code="00",
    stan="000001",
)


class ApprovingAcquirer:
    """The acquirer's side (``acquire.Acquirer``): approves every 0200 after ``pause``
    seconds (a network round trip) and records its RRN (``rrns``, in order; ``sent``, a
    count per RRN); reversals are acknowledged; an offline advice is a test's error.
    ``before_approval`` is where a subclass acts while the 0200 is out."""

    def __init__(self, *, pause: float = 0.0) -> None:
        self.pause = pause
        self.rrns: list[str] = []

    @property
    def sent(self) -> Counter[str]:
        return Counter(self.rrns)

    async def before_approval(self, req: AuthorizationRequest) -> None:
        if self.pause:
            await asyncio.sleep(self.pause)

    async def authorize(self, req: AuthorizationRequest, *, timeout_s: float) -> Authorization:
        self.rrns.append(req.rrn)
        await self.before_approval(req)
        return APPROVED

    async def advise_sale(
        self, req: AuthorizationRequest, *, repeat: bool, timeout_s: float
    ) -> Authorization:
        raise AssertionError("no offline advice here")

    async def reverse(self, req: ReversalRequest, *, timeout_s: float) -> bool:
        return True

    async def advise(self, req: ReversalRequest, *, timeout_s: float) -> bool:
        return True


def service_settings(backend: Backend, **overrides: Any) -> Settings:
    """The backend's database and var folder, no Redis, and ``overrides``."""
    return Settings(
        database_url=backend.database_url,
        var_dir=backend.tmp / "var",
        redis_url=None,
        **overrides,
    )


def transaction_service(backend: Backend, acquirer: Any, **overrides: Any) -> TransactionService:
    """A service on a new engine of its own (``service.engine``: the caller disposes it)."""
    settings = service_settings(backend, **overrides)
    return TransactionService(create_engine(settings), acquirer, settings)


@asynccontextmanager
async def running_service(
    backend: Backend, acquirer: Any, **overrides: Any
) -> AsyncIterator[TransactionService]:
    """``transaction_service``, its engine disposed at the exit."""
    service = transaction_service(backend, acquirer, **overrides)
    try:
        yield service
    finally:
        await service.engine.dispose()


@asynccontextmanager
async def private_engine(backend: Backend, **overrides: Any) -> AsyncIterator[AsyncEngine]:
    """An engine with ``service_settings``, disposed at the exit."""
    engine = create_engine(service_settings(backend, **overrides))
    try:
        yield engine
    finally:
        await engine.dispose()


def new_payment(amount: int) -> tuple[str, TransactionCreate, str]:
    """A new key, a card payment of ``amount`` and its body's fingerprint."""
    create = TransactionCreate.model_validate(body(amount=amount, card=card("tok_visa_4242")))
    return str(uuid.uuid4()), create, body_fingerprint(create)


async def claim_key(
    service: TransactionService,
    merchant: str,
    key: str,
    payment: TransactionCreate,
    *,
    now: datetime,
    lease_s: float,
) -> None:
    """``key`` claimed for ``payment`` in the service's database as a create claims it
    (``store.claim``, committed), at ``now`` with a lease of ``lease_s``."""
    async with atomic(service.engine) as conn:
        assert await store.claim(
            conn,
            store.claim_row(
                merchant_id=merchant,
                key=key,
                fingerprint=body_fingerprint(payment),
                request=payment.stored_request(),
                terminal_id=payment.terminal_id,
                now=now,
                lease_until=now + timedelta(seconds=lease_s),
                deadline_s=service.settings.issuer_deadline,
            ),
        )


def lose_claim_acknowledgements(service: TransactionService) -> None:
    """Each batch of the service's claims commits (or does nothing: the key exists) and its
    connection is then lost before the answer arrives: every claim's end is unseen."""
    committed = service.claims.run

    async def lost(work: Any, *, partition: object = None) -> bool:
        await committed(work, partition=partition)
        raise asyncpg.exceptions.ConnectionDoesNotExistError("connection lost after COMMIT")

    service.claims.run = lost  # type: ignore[method-assign]


async def rows_written(engine: AsyncEngine, merchant: str) -> tuple[int, int, int]:
    """The merchant's transaction rows, ledger entries and outbox events."""
    query = text(
        'SELECT (SELECT count(*) FROM "transaction" WHERE merchant_id = :m),'
        " (SELECT count(*) FROM ledger_entry WHERE merchant_id = :m),"
        " (SELECT count(*) FROM outbox_event WHERE merchant_id = :m)"
    )
    async with engine.connect() as conn:
        transactions, entries, events = (await conn.execute(query, {"m": merchant})).one()
    return int(transactions), int(entries), int(events)
