"""Recovery: a key whose owner is gone — take over, then settle it in doubt; fence.

The one place that takes over an expired lease, used by the completer
(``api/transactions/completer.py``), by a create's retry that finds such a key
(``TransactionService.existing``) and by an abort (``resolution.abort``):

take over  a compare-and-set on the lease token: of any number of takers exactly one wins,
           and the previous owner's final write (guarded by its old token) is refused;
settle     the key's 0200 may have left (its owner died between the claim and the answer),
           so it is NEVER sent again: the key ends declined / acquirer_timeout with a 0420
           reversal advice queued in the same transaction (contract §3.3, §2.9) — except an
           offline sale, whose 0220 advice is repeated (0221) until the acquirer answers;
fence      an abort's take-over turns the key into an ``aborted`` tombstone and queues the
           reversal advice, in one transaction with its outbox event.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING

from api.acquirer import advice
from api.db import atomic, utcnow
from api.events.writer import RequestOutcome
from api.idempotency import store
from api.idempotency.store import KeyRecord
from api.outbox import writer as outbox
from api.transactions import acquire
from api.transactions.outcome import Outcome
from api.transactions.schemas import TransactionCreate

if TYPE_CHECKING:
    from api.transactions.service import TransactionService


class Recovered(StrEnum):
    """What a recovery attempt did (the completer's ``idempay_recoveries_total`` labels)."""

    LOST = "lost"  # someone else took the key over first: nothing done
    ABORTED = "aborted"  # fenced by an abort, its reversal advice queued
    COMPLETED = "completed"  # settled in doubt: declined / acquirer_timeout + advice
    PENDING = "pending"  # the settlement could not be written yet (storage down)


@dataclass(frozen=True, slots=True)
class Recovery:
    result: Recovered
    outcome: Outcome | None = None  # the settlement's answer (COMPLETED, PENDING)


def is_advice(record: KeyRecord) -> bool:
    """The key holds an offline advice (contract §2.2, §4.12): never fenced by the server."""
    if not record.request:
        return False
    try:
        return TransactionCreate.model_validate_json(record.request).is_advice
    except ValueError:
        return False


async def take_over(service: TransactionService, record: KeyRecord, *, now: datetime) -> int | None:
    """The key's new lease token, or None when another taker (or a finish) got there first.

    An offline advice whose lease is live is never taken over (None, nothing written): its
    re-drive is running, and only an abort asks for a live lease (past the issuer timeout,
    ``resolution._abort_may_take_over``) — it could not fence the advice anyway (``fence``),
    and taking the lease would refuse the running re-drive's answer."""
    if record.lease_live(now) and is_advice(record):
        return None
    async with atomic(service.engine) as conn:
        return await store.take_over(conn, record, now=now, lease_s=service.settings.lease_seconds)


async def recover(service: TransactionService, record: KeyRecord, *, now: datetime) -> Recovery:
    """Take over a key whose lease expired and settle it in doubt: declined /
    acquirer_timeout, its reversal advice queued in the same commit. Never a second 0200."""
    token = await take_over(service, record, now=now)
    if token is None:
        return Recovery(Recovered.LOST)
    body = TransactionCreate.model_validate_json(record.request or "{}")
    if body.is_advice:  # an offline sale: its 0220 is repeated (0221), never declined
        outcome = await acquire.authorize_and_finish(
            service,
            record.merchant_id,
            record.key,
            body,
            token=token,
            created_at=record.created_at,
            event=RequestOutcome.CREATED,
            repeat=True,
        )
        result = Recovered.COMPLETED if outcome.status == 201 else Recovered.PENDING
        return Recovery(result, outcome)
    outcome = await acquire.settle_in_doubt(
        service,
        record.merchant_id,
        record.key,
        body,
        token=token,
        created_at=record.created_at,
        event=RequestOutcome.CREATED,
    )
    result = Recovered.COMPLETED if outcome.status == 201 else Recovered.PENDING
    return Recovery(result, outcome)


async def fence(
    service: TransactionService, record: KeyRecord, token: int, *, reason: str | None = None
) -> bool:
    """Turn a key we own into an aborted tombstone and queue the reversal advice of its
    0200 (which may have left), in one transaction with its outbox event: fence and advice
    commit together or not at all. False when the token was no longer ours (nothing
    changed). ``reason``: an operator's,
    recorded in the outbox event.

    An offline advice is never fenced by a client's abort (``reason`` None: the HTTP route):
    the terminal already sold (contract §2.4, §4.12) — False, nothing changed; the key stays
    the server's, re-driven until the issuer answers. An operator's fence (``idempay admin
    key fence``, with its ``reason``) still fences it: the deliberate way out of an issuer
    that will never answer, reconciled by the merchant."""
    if reason is None and is_advice(record):
        return False
    now = utcnow()
    request = TransactionCreate.model_validate_json(record.request or "{}")
    async with atomic(service.engine) as conn:
        fenced = await store.fence_owned(
            conn, merchant_id=record.merchant_id, key=record.key, token=token, now=now
        )
        if fenced:  # its 0200 may have left: the acquirer is told to undo it
            await acquire.queue_advice(
                service,
                conn,
                kind=advice.ABORT,
                merchant_id=record.merchant_id,
                key=record.key,
                body=request,
            )
            await outbox.append(
                conn,
                merchant_id=record.merchant_id,
                event_type=outbox.ABORTED,
                transaction_id=record.key,
                data={"id": record.key, "status": "aborted"},
                now=now,
                reason=reason,
            )
    if fenced:
        # under the database's epoch, read now: this server's may be behind it (re-read every
        # few seconds, in the background) while the claimer's busy hint, and the retries that
        # meet it, are under the database's (contract §3.6)
        if service.cache.enabled:
            await service.bind_epoch()
        await service.cache.mark_fenced(record.merchant_id, record.key)
    return fenced
