"""Phase 2 across the network, and its three endings (contract §2.9, DESIGN.md "Create").

The key's claim is committed before this runs; no database transaction is open while the
0200 is out (the link asserts it). ONE 0200 per key, ever — the link never resends it:

answered     0210 → phase 3: the transaction, its ledger entry and the stored response,
             guarded by the lease token (``finish``)
in doubt     no answer within ``IDEMPAY_ACQUIRER_TIMEOUT``, or the connection broke after the
             first byte: the key settles ``declined`` / ``acquirer_timeout`` in the SAME
             transaction that queues its 0420 reversal advice (``settle_in_doubt``)
never sent   no connection, nothing written: the claim is dropped and the create answers
             503 — nothing was processed, and that is the truth

A finish or settlement that cannot reach the database leaves the key ``processing``; its
lease runs out and the completer settles it in doubt (declined + advice): an approval the
acquirer gave us is then reversed, never left standing without a sale.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import structlog

from api.acquirer import advice
from api.acquirer.messages import MessageError
from api.acquirer.types import (
    Authorization,
    AuthorizationRequest,
    InDoubt,
    NeverSent,
    ReversalRequest,
)
from api.db import atomic, utcnow
from api.errors import ServiceUnavailableError
from api.events.writer import RequestOutcome
from api.idempotency import store
from api.idempotency.store import KeyState
from api.metrics import ACQUIRER_IN_DOUBT, ACQUIRER_LATE_ANSWERS, IN_FLIGHT
from api.storage_errors import storage_unavailable
from api.transactions.outcome import IdempotencyStatus, Outcome, from_error
from api.transactions.schemas import TransactionCreate

if TYPE_CHECKING:
    from datetime import datetime

    from sqlalchemy.ext.asyncio import AsyncConnection

    from api.transactions.service import TransactionService

log = structlog.get_logger("idempay.acquire")

ACQUIRER_TIMEOUT_REASON = "acquirer_timeout"
WRITE_ATTEMPTS = 4  # a finish that meets a storage error is tried again this many times
NOT_SENT_DETAIL = (
    "The acquirer could not be reached; nothing was sent or processed. Retry with the same key."
)


class AcquirerUnavailableError(ServiceUnavailableError):
    """No connection to the acquirer: the 0200 never left; nothing was processed."""

    title = "Acquirer unreachable; nothing was processed"


class Acquirer(Protocol):
    """What the pipeline asks of the acquirer link (``api.acquirer.link.AcquirerLink``)."""

    async def authorize(self, req: AuthorizationRequest, *, timeout_s: float) -> Authorization:
        """One 0200; raises NeverSent or InDoubt."""

    async def reverse(self, req: ReversalRequest, *, timeout_s: float) -> bool:
        """One 0400; True when a 0410 acknowledged it."""

    async def advise(self, req: ReversalRequest, *, timeout_s: float) -> bool:
        """One 0420/0421; True when a 0430 acknowledged it."""

    async def advise_sale(
        self, req: AuthorizationRequest, *, repeat: bool, timeout_s: float
    ) -> Authorization:
        """One 0220 (0221 when ``repeat``) for an offline sale; raises NeverSent or InDoubt."""


@dataclass
class CreateAnswer:
    """Between ``drive`` and its work: whether the create has been answered 202 already,
    and whether the work is dropping the claim (its 503 is then the answer)."""

    answered: bool = False
    releasing: bool = False


def unsendable(exc: MessageError) -> Authorization:
    """A sale the acquirer link cannot carry (e.g. an amount of 10^12 minor units: field 4
    holds twelve digits) is declined here, as the acquirer would (``13`` invalid amount,
    else ``12`` invalid transaction): nothing was sent, nothing to reverse."""
    code, reason = (
        ("13", "invalid_amount") if "amount" in str(exc) else ("12", "invalid_transaction")
    )
    log.warning("sale_not_sendable", why=str(exc))
    return Authorization(
        approved=False,
        authorization_code=None,
        decline_reason=reason,
        response_code=code,
        stan="000000",
    )


def in_doubt_answer(stan: str) -> Authorization:
    return Authorization(
        approved=False,
        authorization_code=None,
        decline_reason=ACQUIRER_TIMEOUT_REASON,
        response_code="",
        stan=stan,
    )


async def authorize_and_finish(
    service: TransactionService,
    merchant_id: str,
    key: str,
    body: TransactionCreate,
    *,
    token: int,
    created_at: datetime,
    event: RequestOutcome,
    repeat: bool = False,
    answer: CreateAnswer | None = None,
) -> Outcome:
    """Phases 2–3 for a key we own (lease ``token``). Runs to its end even when the create
    has already answered 202: the server finishes the key itself. ``repeat``: an offline
    sale's advice sent again (0221) by the completer."""
    request = service.auth_request(merchant_id, key, body)
    if body.is_advice:
        return await _forward_advice(
            service,
            merchant_id,
            key,
            body,
            request,
            token=token,
            created_at=created_at,
            event=event,
            repeat=repeat,
        )
    IN_FLIGHT.inc()
    try:
        auth = await service.acquirer.authorize(
            request, timeout_s=service.settings.acquirer_timeout
        )
    except MessageError as exc:  # the sale does not fit the wire: nothing was sent
        auth = unsendable(exc)
    except NeverSent:
        if answer is not None and answer.answered:
            # the create already said 202 ("the server finishes it"): the key must end
            # terminal on its own, never vanish — declined / acquirer_timeout, its 0420
            # queued (an acquirer that never saw the 0200 acknowledges it too)
            return await settle_in_doubt(
                service, merchant_id, key, body, token=token, created_at=created_at, event=event
            )
        if answer is not None:
            answer.releasing = True  # the create waits for the 503 now, never answers 202
        return await _release(service, merchant_id, key, body, token=token, event=event)
    except InDoubt as exc:
        ACQUIRER_IN_DOUBT.inc()
        log.warning("acquirer_in_doubt", key=key, rrn=request.rrn, why=str(exc))
        return await settle_in_doubt(
            service,
            merchant_id,
            key,
            body,
            token=token,
            created_at=created_at,
            event=event,
            stan=getattr(exc, "stan", None) or "000000",
            transmitted_at=getattr(exc, "transmitted_at", None),
        )
    finally:
        IN_FLIGHT.dec()
    return await _write_ending(
        service, merchant_id, key, body, auth, token=token, created_at=created_at, event=event
    )


async def _forward_advice(
    service: TransactionService,
    merchant_id: str,
    key: str,
    body: TransactionCreate,
    request: AuthorizationRequest,
    *,
    token: int,
    created_at: datetime,
    event: RequestOutcome,
    repeat: bool,
) -> Outcome:
    """An offline sale (contract §4.12): the terminal already sold, so it is never declined
    for want of an answer. It goes as a 0220 advice — store and forward, repeatable by
    design — not a 0200: unanswered, the lease is handed over and the completer repeats it
    as a 0221 (backing off) until the acquirer answers; the acquirer applies it once per RRN.
    At most one 0200 per key still holds: an advice key never sends one."""
    IN_FLIGHT.inc()
    try:
        auth = await service.acquirer.advise_sale(
            request, repeat=repeat, timeout_s=service.settings.acquirer_timeout
        )
    except MessageError as exc:
        auth = unsendable(exc)
    except (NeverSent, InDoubt):
        await _hand_over(service, merchant_id, key, token)
        return service.processing(key, body.terminal_id, event)
    finally:
        IN_FLIGHT.dec()
    return await _write_ending(
        service, merchant_id, key, body, auth, token=token, created_at=created_at, event=event
    )


async def _hand_over(service: TransactionService, merchant_id: str, key: str, token: int) -> None:
    """Expire our lease now so the completer repeats the advice."""
    await service.cache.clear_busy(merchant_id, key)
    try:
        async with atomic(service.engine) as conn:
            await store.release(conn, merchant_id=merchant_id, key=key, token=token, until=utcnow())
    except Exception as exc:  # storage down: the lease simply runs out on its own
        if not storage_unavailable(exc):
            raise


async def settle_in_doubt(
    service: TransactionService,
    merchant_id: str,
    key: str,
    body: TransactionCreate,
    *,
    token: int,
    created_at: datetime,
    event: RequestOutcome,
    stan: str = "000000",
    transmitted_at: datetime | None = None,
) -> Outcome:
    """The key → declined / acquirer_timeout, and its 0420 queued, in one transaction."""
    return await _write_ending(
        service,
        merchant_id,
        key,
        body,
        in_doubt_answer(stan),
        token=token,
        created_at=created_at,
        event=event,
        transmitted_at=transmitted_at,
    )


async def _write_ending(
    service: TransactionService,
    merchant_id: str,
    key: str,
    body: TransactionCreate,
    auth: Authorization,
    *,
    token: int,
    created_at: datetime,
    event: RequestOutcome,
    transmitted_at: datetime | None = None,
) -> Outcome:
    in_doubt = auth.decline_reason == ACQUIRER_TIMEOUT_REASON and not auth.response_code
    await service.cache.clear_busy(merchant_id, key)
    text: str | None = None

    # One work for every attempt: its stored response (``finish.text``) tells, after an
    # attempt whose end was unseen, whether the key was completed by us.
    finish = service.finish_work(merchant_id, key, body, auth, token, created_at)

    async def ending(conn: AsyncConnection) -> str | None:
        """The in-doubt settlement with its 0420, in a batch of finishes."""
        written = await finish(conn)
        if written is not None:
            await queue_advice(
                service,
                conn,
                kind=advice.TIMEOUT,
                merchant_id=merchant_id,
                key=key,
                body=body,
                stan=auth.stan,
                transmitted_at=transmitted_at,
            )
        return written

    # The common finish as a ``Finish`` (a batch of them completes its keys together); the
    # in-doubt settlement with its 0420 as a work of its own.
    work = ending if in_doubt else finish
    # The epoch before the commit: the answer is cached under it, never under one renewed
    # (after a restore) while the commit was on its way back (contract §3.6).
    epoch, announced = service.cache.epoch, service.cache.announcement
    unseen = False  # an attempt failed after it may have committed
    for attempt in range(WRITE_ATTEMPTS):
        try:
            text = await service.finishes.run(work, partition=service.partition_of(merchant_id))
            break
        except Exception as exc:
            if not storage_unavailable(exc) or attempt == WRITE_ATTEMPTS - 1:
                log.warning("finish_failed", key=key, error=type(exc).__name__)
                # The key stays processing: its lease runs out and the completer settles it
                # in doubt (declined + reversal advice). The terminal looks it up.
                return service.processing(key, body.terminal_id, event)
            unseen = True
            await asyncio.sleep(0.25 * 2**attempt)
    await service.refresh_epoch()
    if text is None and unseen:  # the lease gone: perhaps to our own earlier attempt
        text = await _ours_after_unseen_end(service, merchant_id, key, finish.text)
    if text is None:  # the lease was taken over meanwhile (the completer, an abort)
        if not in_doubt:
            ACQUIRER_LATE_ANSWERS.inc()  # its settlement queued the advice that undoes it
        return await service.answer_after_lost_lease(merchant_id, key, body, event)
    outcome = Outcome(
        201, text.encode(), event, IdempotencyStatus.CREATED, terminal_id=body.terminal_id
    )
    fingerprint = service.fingerprint_of(body)
    await service.remember(merchant_id, key, fingerprint, outcome, epoch=epoch, announced=announced)
    return outcome


async def _ours_after_unseen_end(
    service: TransactionService, merchant_id: str, key: str, text: str
) -> str | None:
    """After a finish whose COMMIT's answer was lost, a retry finds the lease gone: the key
    is ours if it stores our very response (the body names its processing time to the
    microsecond: no other owner's settlement writes the same text). ``text`` then, else
    None (taken over by someone else, or unreadable now)."""
    try:
        record = await service.read(merchant_id, key)
    except Exception as exc:
        if not storage_unavailable(exc):
            raise
        return None
    if record is not None and record.state == KeyState.COMPLETED and record.response_body == text:
        return text
    return None


async def queue_advice(
    service: TransactionService,
    conn: object,
    *,
    kind: str,
    merchant_id: str,
    key: str,
    body: TransactionCreate,
    stan: str = "000000",
    transmitted_at: datetime | None = None,
) -> None:
    """Queue the 0420 for ``key`` inside the caller's transaction (``conn``)."""
    await advice.queue(
        conn,  # type: ignore[arg-type]
        kind=kind,
        merchant_id=merchant_id,
        key=key,
        rrn=service.rrn(merchant_id, key),
        terminal_id=body.terminal_id,
        type=body.type,
        amount=body.amount,
        currency=body.currency,
        now=utcnow(),
        original_stan=stan or "000000",
        original_transmitted_at=transmitted_at,
    )


async def _release(
    service: TransactionService,
    merchant_id: str,
    key: str,
    body: TransactionCreate,
    *,
    token: int,
    event: RequestOutcome,
) -> Outcome:
    """Nothing left: drop the claim and answer 503 (true). If the drop itself cannot be
    written the key stays claimed — then it is in flight (202), settled by the completer."""
    await service.cache.clear_busy(merchant_id, key)
    try:
        async with atomic(service.engine) as conn:
            dropped = await store.forget(conn, merchant_id=merchant_id, key=key, token=token)
    except Exception as exc:
        if not storage_unavailable(exc):
            raise
        return service.processing(key, body.terminal_id, event)
    if not dropped:  # taken over meanwhile: the row tells the truth
        return await service.answer_after_lost_lease(merchant_id, key, body, event)
    return from_error(
        AcquirerUnavailableError(NOT_SENT_DETAIL),
        event=RequestOutcome.ERROR,
        idempotency_status=IdempotencyStatus.NOT_FOUND,
        terminal_id=body.terminal_id,
    )
