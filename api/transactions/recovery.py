"""Recovery: a key whose owner is gone — take over, then settle or re-drive; fence.

The one place that takes over an expired lease, used by the completer
(``api/idempotency/completer.py``), by a create's retry that finds such a key
(``TransactionService.existing``) and by an abort (``resolution.abort``):

take over  a compare-and-set on the lease token: of any number of takers exactly one wins,
           and the previous owner's final write (guarded by its old token) is refused;
settle     past the issuer deadline a key is not re-driven: it is fenced — except an offline
           advice (``entry_mode: offline``): the terminal already sold and the customer has
           the goods, so the server never fences it; it is re-driven until the issuer answers;
re-drive   phases 2–3 again with the same derived issuer key (the issuer never authorizes
           twice for one key), through ``TransactionService.drive``;
fence      the owner turns the key into an ``aborted`` tombstone and voids the issuer call,
           in one transaction with its outbox event.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING

from api.db import atomic, utcnow
from api.events.writer import RequestOutcome
from api.idempotency import store
from api.idempotency.store import KeyRecord
from api.outbox import writer as outbox
from api.transactions.outcome import Outcome
from api.transactions.schemas import TransactionCreate

if TYPE_CHECKING:
    from api.transactions.service import TransactionService


class Recovered(StrEnum):
    """What a recovery attempt did (the completer's ``idempay_recoveries_total`` labels)."""

    LOST = "lost"  # someone else took the key over first: nothing done
    ABORTED = "aborted"  # past its issuer deadline: voided and fenced
    COMPLETED = "completed"  # re-driven to its answer
    PENDING = "pending"  # re-driven, and the issuer still did not answer (202)


@dataclass(frozen=True, slots=True)
class Recovery:
    result: Recovered
    outcome: Outcome | None = None  # the re-drive's answer (COMPLETED, PENDING)


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


async def settle(
    service: TransactionService, record: KeyRecord, token: int, now: datetime
) -> int | None:
    """Past the issuer deadline, void the issuer call and fence the key as aborted — never an
    offline advice: the terminal sold it long ago, a fence would lose the sale for good; it
    is re-driven with the same derived issuer key (backing off) until the issuer answers.

    Returns the token when the key is still ours to drive, None when it was settled.
    """
    if record.deadline_at is None or now < record.deadline_at or is_advice(record):
        return token
    await fence(service, record, token)
    return None


async def recover(service: TransactionService, record: KeyRecord, *, now: datetime) -> Recovery:
    """Take over a key whose lease expired, then settle it or re-drive it."""
    token = await take_over(service, record, now=now)
    if token is None:
        return Recovery(Recovered.LOST)
    if await settle(service, record, token, now) is None:
        return Recovery(Recovered.ABORTED)
    body = TransactionCreate.model_validate_json(record.request or "{}")
    outcome = await service.drive(
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
    """Turn a key we own into an aborted tombstone and void its issuer call, in one
    transaction with its outbox event: fence and void commit together or not at all
    (voiding first, in its own commit, let a stalled owner void an authorization and
    then lose the key — found by the SPIN model, docs/protocol/). A remote acquirer
    connector that cannot enlist voids from the ``transaction.aborted`` outbox event.
    False when the token was no longer ours (nothing changed). ``reason``: an operator's,
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
        if fenced:
            await service.issuer.void(
                service.issuer_key(record.merchant_id, record.key),
                merchant_id=record.merchant_id,
                amount=request.amount,
                currency=request.currency,
                conn=conn,
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
        await service.refresh_epoch()
        await service.cache.mark_fenced(record.merchant_id, record.key)
    return fenced
