"""Lookup, abort and reversal: how a terminal resolves a key it is in doubt about."""

from __future__ import annotations

import contextlib
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import structlog

from api.acquirer import advice
from api.acquirer.types import AcquirerError
from api.db import atomic, utcnow
from api.errors import (
    ApiError,
    NotFoundError,
    NotReversibleError,
    RequestInProgressError,
    TransactionAbortedError,
)
from api.events.writer import RequestOutcome as Event
from api.idempotency import store
from api.idempotency.epoch import read_epoch, renew_epoch_in
from api.idempotency.store import KeyRecord, KeyState
from api.outbox import writer as outbox
from api.transactions import recovery, repository
from api.transactions.outcome import IdempotencyStatus as Status
from api.transactions.outcome import Outcome, from_error, key_state_body
from api.transactions.service import ABORTED_DETAIL, TransactionService

log = structlog.get_logger("idempay.reversal")

REVERSAL_WAIT_S = 2.0  # the 0400's answer awaited inline; then the queued 0420 carries it

NOT_FOUND_DETAIL = "Nothing was processed under this key."


async def _current(
    service: TransactionService, record: KeyRecord, txn: Any = None
) -> tuple[bytes, bool]:
    """The transaction body as the database has it now (or as ``txn``, read with the key),
    and whether it is reversed."""
    if txn is None and service.inline is not None:  # one prepared SELECT, no lock (inline.py)
        txn = await service.inline.read_transaction(record.merchant_id, record.key)
    elif txn is None:
        async with service.reader.connect() as conn:
            txn = await repository.get(conn, record.merchant_id, record.key)
    if txn is None:  # completed keys always have their transaction (one commit)
        raise RuntimeError("completed key without transaction")
    return repository.render(txn).encode(), txn.status == "reversed"


async def _current_body(service: TransactionService, record: KeyRecord) -> bytes:
    return (await _current(service, record))[0]


def _epochs(*epochs: str | None) -> list[str]:
    """The distinct known epochs, in order."""
    return list(dict.fromkeys(e for e in epochs if e is not None))


async def lookup(service: TransactionService, merchant_id: str, key: str) -> Outcome:
    await service.refresh_epoch()
    # The epoch before the database is read: what it answers is cached under this one, never
    # under an epoch renewed (after a restore) while the read was on its way (contract §3.6).
    epoch = service.cache.epoch
    cached = await service.cache.get_lookup(merchant_id, key)
    if cached is not None:
        return Outcome(200, cached, Event.FOUND, Status.PROCESSED)
    announced = service.cache.announcement  # as seen just now, before the database read
    txn = None
    if service.inline is not None:  # the key and its transaction in one read (one round trip)
        record, txn = await service.inline.read_with_transaction(merchant_id, key)
    else:
        record = await service.read(merchant_id, key)
    if record is None:
        error: ApiError = NotFoundError(NOT_FOUND_DETAIL)
        return from_error(error, event=Event.NOT_FOUND, idempotency_status=Status.NOT_FOUND)
    terminal = record.terminal_id
    if record.state == KeyState.COMPLETED:
        body, reversed_ = await _current(service, record, txn)
        # versioned: if a reversal committed since our read, its entry wins (contract §3.7)
        await service.cache.put_lookup(
            merchant_id, key, body, epoch=epoch, reversed_=reversed_, announced=announced
        )
        return Outcome(200, body, Event.FOUND, Status.PROCESSED, terminal_id=terminal)
    if record.state == KeyState.PROCESSING:
        return service.processing(key, terminal, Event.PROCESSING)
    if record.state == KeyState.ABORTED:
        error = TransactionAbortedError(ABORTED_DETAIL)
        return from_error(
            error, event=Event.FENCED, idempotency_status=Status.ABORTED, terminal_id=terminal
        )
    body = (record.response_body or "").encode()
    return Outcome(410, body, Event.FENCED, Status.EXPIRED, problem=True, terminal_id=terminal)


async def abort(
    service: TransactionService, merchant_id: str, key: str, *, reason: str | None = None
) -> Outcome:
    """``reason``: an operator's (``idempay admin key fence``), recorded in the outbox event
    when this call fences the key; the HTTP route gives none."""
    await service.refresh_epoch()
    record = await service.read(merchant_id, key)
    if record is None:
        now = utcnow()
        async with atomic(service.engine) as conn:
            fenced = await store.fence(
                conn, merchant_id=merchant_id, key=key, state=KeyState.ABORTED, now=now
            )
            if fenced:
                await outbox.append(
                    conn,
                    merchant_id=merchant_id,
                    event_type=outbox.ABORTED,
                    transaction_id=key,
                    data={"id": key, "status": "aborted"},
                    now=now,
                    reason=reason,
                )
        if fenced:
            body = key_state_body(key, KeyState.ABORTED)
            return Outcome(200, body, Event.ABORTED, Status.ABORTED)
        record = await service.read(merchant_id, key)
        if record is None:
            raise RuntimeError("fenced key vanished")
    return await _abort_existing(service, record, reason=reason)


def _abort_may_take_over(
    service: TransactionService, record: KeyRecord, now: datetime, *, operator: bool = False
) -> bool:
    """An abort waits (409) only for a request that may still answer its terminal: within
    the answer time of the claim (``IDEMPAY_ANSWER_WITHIN``). After that the key is the
    server's own (answered 202, still at the acquirer, or abandoned): the terminal's abort
    wins — it takes the lease (a compare-and-set on the token, so the driver's final write is
    refused), fences the key and queues the reversal advice of its 0200 in the same commit. A
    client's abort never does for an offline advice: the server never fences one for a
    client (``recovery.fence``), so taking its lease would only stall its repeated advice; an
    operator's (``idempay admin key fence``, with a reason) may."""
    if not operator and recovery.is_advice(record):
        return False
    if not record.lease_live(now):
        return True
    grace = timedelta(seconds=service.settings.answer_within + 0.5)
    return now >= record.created_at + grace


async def _abort_existing(
    service: TransactionService, record: KeyRecord, *, reason: str | None = None
) -> Outcome:
    key, terminal = record.key, record.terminal_id
    if record.state == KeyState.COMPLETED:
        body = await _current_body(service, record)
        return Outcome(200, body, Event.ALREADY_PROCESSED, Status.PROCESSED, terminal_id=terminal)
    if record.state in (KeyState.ABORTED, KeyState.EXPIRED):
        body = key_state_body(key, record.state)
        return Outcome(200, body, Event.ABORTED, Status(record.state), terminal_id=terminal)
    now = utcnow()
    if _abort_may_take_over(service, record, now, operator=reason is not None):
        token = await recovery.take_over(service, record, now=now)
        if token is not None:
            await recovery.fence(service, record, token, reason=reason)
        # Fenced by us, or the take-over lost to a completion or a fence: tell the truth.
        again = await service.read(record.merchant_id, key)
        if again is not None and again.state != KeyState.PROCESSING:
            return await _abort_existing(service, again)
    error = RequestInProgressError(
        "The key is being processed right now; retry the abort after Retry-After."
    )
    outcome = from_error(
        error, event=Event.IN_PROGRESS, idempotency_status=Status.IN_PROGRESS, terminal_id=terminal
    )
    recheck = _abort_possible_in(service, record, now, operator=reason is not None)
    return replace(outcome, recheck_s=recheck)


def _abort_possible_in(
    service: TransactionService, record: KeyRecord, now: datetime, *, operator: bool = False
) -> float:
    """Seconds until ``_abort_may_take_over`` turns true with no settlement to announce it
    — for an advice, which it never does, when its re-drive's lease ends (at least 1 s)."""
    if not operator and recovery.is_advice(record):
        left = (record.lease_until - now).total_seconds() if record.lease_until else 0.0
        return max(1.0, left)
    grace = timedelta(seconds=service.settings.answer_within + 0.5)
    at = record.created_at + grace
    if record.lease_until is not None:
        at = min(at, record.lease_until)
    return max(0.0, (at - now).total_seconds())


async def reverse(
    service: TransactionService, merchant_id: str, key: str, *, reason: str | None = None
) -> Outcome:
    """``reason``: an operator's (``idempay admin key reverse``), recorded in the outbox
    event when this call reverses the transaction; the HTTP route gives none."""
    await service.refresh_epoch()
    epoch = service.cache.epoch  # before the database is read (as in ``lookup``)
    record = await service.read(merchant_id, key)
    if record is None:
        error: ApiError = NotFoundError(NOT_FOUND_DETAIL)
        return from_error(error, event=Event.REJECTED, idempotency_status=Status.NOT_FOUND)
    terminal = record.terminal_id
    if record.state == KeyState.PROCESSING:
        error = RequestInProgressError("The transaction is still being processed.")
        return from_error(
            error, event=Event.REJECTED, idempotency_status=Status.IN_PROGRESS, terminal_id=terminal
        )
    if record.state != KeyState.COMPLETED:
        error = NotReversibleError(f"The key was {record.state}: nothing to reverse.")
        return from_error(
            error, event=Event.REJECTED, idempotency_status=record.state, terminal_id=terminal
        )
    async with atomic(service.engine) as conn:
        txn = await repository.get(conn, merchant_id, key)
        if txn is None:
            raise RuntimeError("completed key without transaction")
        if txn.status == "declined":
            error = NotReversibleError("A declined transaction cannot be reversed.")
            return from_error(
                error,
                event=Event.REJECTED,
                idempotency_status=Status.PROCESSED,
                terminal_id=terminal,
            )
        # Before the commit: from here on no cache writer may store "approved" for the key,
        # whenever its database read was (contract §3.7) — under the database's epoch too:
        # this server's may be behind it (re-read every few seconds, in the background, and
        # no marker check on this path), while other servers serve lookups under it (§3.6).
        marked = _epochs(epoch, await read_epoch(conn) if service.cache.enabled else None)
        renewed = None
        unmarked = not await service.cache.mark_reversing(merchant_id, key, epochs=marked)
        if unmarked and txn.status != "reversed":
            # Redis may hold an "approved" it cannot be told to take back, and Redis is
            # advisory: the reversal still commits (contract §3.4), and with it a new epoch
            # for the database, so every entry cached before it — that "approved" among them
            # — is never served again once a server has re-read the epoch (§3.6, §3.7).
            _, renewed = await renew_epoch_in(conn)
        now = utcnow()
        reversed_now = await repository.reverse(conn, txn, now=now)
        if reversed_now:
            await advice.queue(
                conn,
                kind=advice.REVERSAL,
                merchant_id=merchant_id,
                key=key,
                rrn=service.rrn(merchant_id, key),
                terminal_id=txn.terminal_id,
                type=txn.type,
                amount=txn.amount,
                currency=txn.currency,
                now=now,
            )
            data = repository.body_of(txn, status="reversed")
            data["reversed_at"] = repository.iso(now)
            await outbox.append(
                conn,
                merchant_id=merchant_id,
                event_type=outbox.REVERSED,
                transaction_id=key,
                data=data,
                now=now,
                reason=reason,
            )
    if renewed is not None:  # this server follows its own renewal at once; the others
        # within their periodic re-read (api.transactions.service.EPOCH_RECHECK_SECONDS)
        log.warning(
            "reversal.cache_unmarked",
            merchant_id=merchant_id,
            key=key,
            epoch=renewed,
            detail="Redis could not be told of the reversal: the database's epoch was renewed; "
            "the cache serves nothing until the new epoch is announced (idempay admin new-epoch "
            "once Redis answers, or when the old announcement expires)",
        )
        await service.bind_epoch()
    if reversed_now:  # the reversal and its advice are committed: now the 0400 (no
        # transaction open); unanswered, the advice worker repeats it as a 0420
        await _send_reversal(service, merchant_id, key)
    body, is_reversed = await _current(service, record)
    # and under an epoch renewed while the reversal was on its way (read after the commit)
    after = await service.bind_epoch() if service.cache.enabled and is_reversed else None
    for each in _epochs(*marked, after) if is_reversed else _epochs(epoch):
        await service.cache.put_lookup(merchant_id, key, body, epoch=each, reversed_=is_reversed)
    event = Event.REVERSED if reversed_now else Event.ALREADY_REVERSED
    return Outcome(200, body, event, Status.PROCESSED, terminal_id=terminal)


async def _send_reversal(service: TransactionService, merchant_id: str, key: str) -> None:
    """The 0400 for a reversal whose 0420 is already queued: acknowledged → the advice is
    done; otherwise the advice worker sends it (store and forward, contract §2.9)."""
    async with service.reader.connect() as conn:
        queued = await advice.get(conn, merchant_id, key)
    if queued is None or queued.acknowledged_at is not None:
        return
    request = replace(queued.request(), repeat=False)
    try:
        acknowledged = await service.acquirer.reverse(
            request, timeout_s=min(service.settings.acquirer_timeout, REVERSAL_WAIT_S)
        )
    except AcquirerError:
        return
    if acknowledged:
        with contextlib.suppress(Exception):  # storage down: the worker's 0420 repeats it
            async with atomic(service.engine) as conn:
                await advice.acknowledge(conn, queued, now=utcnow())
