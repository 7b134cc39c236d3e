"""Create: the atomic phases (contract §2–3, DESIGN.md "Create").

phase 1  claim the key (unique index)           ┐ one transaction when the issuer answers
phase 2  authorize with the derived issuer key  │ inline (the simulator's instant tokens);
phase 3  transaction + ledger + stored response ┘ otherwise three steps, no transaction
                                                  open across the issuer call, and the final
                                                  write guarded by the lease token.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
from dataclasses import replace
from datetime import datetime, timedelta

import structlog
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from api.config import Settings
from api.db import atomic, utcnow
from api.errors import (
    AdviceTooOldError,
    ClockSkewError,
    IdempotencyKeyReusedError,
    RequestExpiredError,
    RequestInProgressError,
    TransactionAbortedError,
)
from api.events.writer import RequestOutcome
from api.idempotency import store
from api.idempotency.cache import ResponseCache
from api.idempotency.epoch import read_epoch
from api.idempotency.keys import body_fingerprint, uuid7_time
from api.idempotency.store import KeyRecord, KeyState
from api.metrics import IN_FLIGHT, LATE_VOID_FAILURES
from api.outbox import writer as outbox
from api.transactions import inline as one_write
from api.transactions import recovery, repository
from api.transactions.guard import DuplicateOf, Guard, blocked, find_suspect, lock_key
from api.transactions.issuer import (
    Authorization,
    AuthorizationRequest,
    Issuer,
    derive_issuer_key,
)
from api.transactions.outcome import IdempotencyStatus, Outcome, from_error, key_state_body
from api.transactions.schemas import TransactionCreate

log = structlog.get_logger("idempay.service")
EPOCH_RECHECK_SECONDS = 5.0
ABORTED_DETAIL = "The key was fenced by an abort; it was not and will not be processed."


def _key_reused(idempotency_status: IdempotencyStatus, terminal_id: str | None) -> Outcome:
    return from_error(
        IdempotencyKeyReusedError("This Idempotency-Key was used with a different request body."),
        event=RequestOutcome.KEY_REUSED,
        idempotency_status=idempotency_status,
        terminal_id=terminal_id,
    )


class TransactionService:
    def __init__(
        self,
        engine: AsyncEngine,
        issuer: Issuer,
        settings: Settings,
        *,
        cache: ResponseCache | None = None,
        inline: one_write.InlineWriter | None = None,
    ) -> None:
        self.engine = engine
        # Reads need no transaction: on Postgres an AUTOCOMMIT connection answers a replay or a
        # lookup in one round trip instead of BEGIN/SELECT/ROLLBACK; on SQLite a plain BEGIN
        # (a WAL snapshot) instead of the writers' BEGIN IMMEDIATE, so reads take no lock.
        self.reader = (
            engine.execution_options(isolation_level="AUTOCOMMIT")
            if engine.dialect.name == "postgresql"
            else engine.execution_options(sqlite_deferred_begin=True)
        )
        # The one-write create and the key read of the hot path (api/transactions/inline.py).
        self.inline = inline
        self.issuer = issuer
        self.settings = settings
        self.cache = cache or ResponseCache(None, prefix="", ttl=1, lookup_ttl=1, busy_ttl=1)
        self._epoch_due = 0.0
        self._epoch_task: asyncio.Task[None] | None = None

    # ----------------------------------------------------------------- helpers
    async def bind_epoch(self) -> None:
        """Bind the cache to the database's epoch (contract §3.6); keep the known one if the
        database does not answer in time."""
        try:
            async with asyncio.timeout(self.settings.db_timeout), self.reader.connect() as conn:
                self.cache.bind_epoch(await read_epoch(conn))
        except Exception:  # storage down: the cache stays bound to what we knew (or off)
            return

    async def refresh_epoch(self) -> None:
        """Before using the cache: the first time, wait for the epoch; after that re-read it
        every few seconds in the background, so a running server follows a new epoch."""
        if self.cache.enabled and self.cache.epoch_suspect:
            await self.bind_epoch()  # a new epoch was announced: re-read it before serving
            self._epoch_due = time.monotonic() + EPOCH_RECHECK_SECONDS
            return
        if not self.cache.enabled or time.monotonic() < self._epoch_due:
            return
        self._epoch_due = time.monotonic() + EPOCH_RECHECK_SECONDS
        if self.cache.epoch is None:
            await self.bind_epoch()
        elif self._epoch_task is None or self._epoch_task.done():
            self._epoch_task = asyncio.create_task(self.bind_epoch())

    def issuer_key(self, merchant_id: str, key: str) -> str:
        return derive_issuer_key(self.settings.secret_key, merchant_id, key)

    def card_fingerprint(self, token: str) -> str:
        return hmac.new(
            self.settings.secret_key.encode(), token.encode(), hashlib.sha256
        ).hexdigest()

    async def read(self, merchant_id: str, key: str) -> KeyRecord | None:
        if self.inline is not None:
            return await self.inline.read(merchant_id, key)
        async with self.reader.connect() as conn:
            return await store.get(conn, merchant_id, key)

    async def must_read(self, merchant_id: str, key: str) -> KeyRecord:
        record = await self.read(merchant_id, key)
        if record is None:  # a key row is never deleted while a request can still use it
            raise RuntimeError("claimed key vanished")
        return record

    def processing(self, key: str, terminal_id: str | None, event: RequestOutcome) -> Outcome:
        """202: the server finishes the key itself; look it up after Retry-After."""
        return Outcome(
            202,
            key_state_body(key, KeyState.PROCESSING),
            event,
            IdempotencyStatus.IN_PROGRESS,
            terminal_id=terminal_id,
            retry_after=True,
        )

    # ------------------------------------------------------------------ create
    async def create(
        self,
        merchant_id: str,
        key: str,
        body: TransactionCreate,
        fingerprint: str,
        *,
        guard_s: int | None = None,
    ) -> Outcome:
        """Claim → authorize → commit. A committed answer in Redis first; then the common
        case, an inline token in ONE write (api/transactions/inline.py); then the general
        path, phase by phase (``_create_in_phases``). ``guard_s``: the merchant's duplicate
        guard window (api/transactions/guard.py), None when its guard is off — then nothing
        of the guard runs."""
        await self.refresh_epoch()
        cached, busy = await self.cache.before_create(merchant_id, key)
        if cached is not None:  # a committed answer: replay it, or refuse a different body
            return self._answer_completed(
                cached.fingerprint, fingerprint, cached.status, cached.body, cached.terminal_id
            )
        if busy == fingerprint:
            return self._in_progress(body.terminal_id)
        guard = None
        if guard_s is not None or body.allow_duplicate:
            guard, body = self._guard(merchant_id, body, guard_s)
        if self._fits_one_write(body, key, start := utcnow()):
            written = await self._create_in_one_write(
                merchant_id, key, body, fingerprint, start, guard
            )
            if written is not None:
                return written
        return await self._create_in_phases(merchant_id, key, body, fingerprint, guard)

    def _guard(
        self, merchant_id: str, body: TransactionCreate, guard_s: int | None
    ) -> tuple[Guard | None, TransactionCreate]:
        """The guard's check for this create — None when the guard is off, or for a create
        it never judges (a refund, an offline advice) — and the body with ``allow_duplicate``
        cleared: from here on the field means "the guard found a suspect and the cashier
        overrode it", set only where the check found one (``_overridden``); it becomes the
        transaction's ``duplicate_override`` and is kept in the claimed key's stored request
        (``TransactionCreate.stored_request``), so the completer records it too."""
        allow = body.allow_duplicate
        if allow:
            body = body.model_copy(update={"allow_duplicate": False})
        if guard_s is None or body.type != "purchase" or body.is_advice:
            return None, body
        card = self.card_fingerprint(body.card.token)
        lock = lock_key(merchant_id, body.terminal_id, card, body.amount, body.currency)
        return Guard(window_s=guard_s, allow=allow, card_fingerprint=card, lock=lock), body

    async def _suspect(
        self,
        conn: AsyncConnection,
        guard: Guard,
        merchant_id: str,
        key: str,
        body: TransactionCreate,
        now: datetime,
    ) -> str | None:
        return await find_suspect(
            conn,
            guard,
            merchant_id=merchant_id,
            key=key,
            terminal_id=body.terminal_id,
            amount=body.amount,
            currency=body.currency,
            created_at=now,
        )

    async def _create_in_phases(
        self,
        merchant_id: str,
        key: str,
        body: TransactionCreate,
        fingerprint: str,
        guard: Guard | None = None,
    ) -> Outcome:
        """The general path: an existing key answers from its row; a new one is judged
        (clock skew, age), then claimed and driven — in one transaction when the issuer
        answers inline, else claim, issuer call (no transaction open), guarded finish."""
        record = await self.read(merchant_id, key)  # one autocommit round trip on Postgres
        now = utcnow()
        if record is not None:
            return await self.existing(record, fingerprint)
        if (skew := self._clock_skew(body, key, now)) is not None:
            return skew
        if self._too_late(body, key, now):
            if body.is_advice:  # the terminal already sold: nothing to fence, report it
                return _advice_too_old(body.terminal_id)
            return await self._fence_expired(merchant_id, key, body, fingerprint, now)
        if self.issuer.answers_inline(body.card.token):
            outcome = await self._process_inline(merchant_id, key, body, fingerprint, now, guard)
        else:
            outcome = await self._claim_and_drive(merchant_id, key, body, fingerprint, now, guard)
        if outcome is None:  # a concurrent request won the key between our read and insert
            return await self.existing(await self.must_read(merchant_id, key), fingerprint)
        return outcome

    def _fits_one_write(self, body: TransactionCreate, key: str, now: datetime) -> bool:
        """An inline token whose times need no judging: the common create."""
        if self.inline is None or not self.issuer.answers_inline(body.card.token):
            return False
        return self._clock_skew(body, key, now) is None and not self._too_late(body, key, now)

    async def _create_in_one_write(
        self,
        merchant_id: str,
        key: str,
        body: TransactionCreate,
        fingerprint: str,
        now: datetime,
        guard: Guard | None = None,
    ) -> Outcome | None:
        """Phases 1–3 as one write (api/transactions/inline.py). The key existed: the answer
        from its row. None when nothing was written and the row is not known yet: the general
        path reads it and answers from it. With the guard on, its check is in the same write:
        a new key it refuses wrote nothing (409 ``suspected_duplicate``)."""
        assert self.inline is not None
        rows = one_write.build(self, merchant_id, key, body, fingerprint, now)
        if guard is None:
            written = await self.inline.create(rows)
        else:
            written = await self.inline.create(rows, guard)
            if isinstance(written, DuplicateOf):
                return blocked(written.id, body.terminal_id)
        if isinstance(written, KeyRecord):  # the key exists: replay, 409, 410 or 422
            return await self.existing(written, fingerprint)
        if not written:
            return None
        text = rows.response_body.encode()
        outcome = _created(text, RequestOutcome.CREATED, body.terminal_id)
        await self.remember(merchant_id, key, fingerprint, outcome)
        return outcome

    async def remember(
        self, merchant_id: str, key: str, fingerprint: str, outcome: Outcome
    ) -> None:
        """After commit: let Redis answer the next replay (advisory, best effort)."""
        await self.cache.put_response(
            merchant_id,
            key,
            fingerprint=fingerprint,
            status=outcome.status,
            body=outcome.body,
            terminal_id=outcome.terminal_id,
            created=outcome.event == RequestOutcome.CREATED,
        )

    def _answer_completed(
        self,
        stored_fp: str | None,
        fingerprint: str,
        status: int,
        body: bytes,
        terminal_id: str | None,
    ) -> Outcome:
        if stored_fp != fingerprint:
            return _key_reused(IdempotencyStatus.PROCESSED, terminal_id)
        return Outcome(
            status,
            body,
            RequestOutcome.REPLAYED,
            IdempotencyStatus.REPLAYED,
            {"Idempotent-Replayed": "true"},
            terminal_id=terminal_id,
        )

    def in_flight(self, terminal_id: str | None) -> Outcome:
        """409 ``request_in_progress`` for a create answered before its work ended (the
        worker stopping: ``waiting.before_exit``)."""
        return self._in_progress(terminal_id)

    def _in_progress(
        self, terminal_id: str | None, *, lease_until: datetime | None = None
    ) -> Outcome:
        outcome = from_error(
            RequestInProgressError(
                "A request with this key is being processed; retry after Retry-After."
            ),
            event=RequestOutcome.IN_PROGRESS,
            idempotency_status=IdempotencyStatus.IN_PROGRESS,
            terminal_id=terminal_id,
        )
        if lease_until is None:
            return outcome
        # At the lease's end a retry may take the key over: a waiter looks again then.
        return replace(outcome, recheck_s=max(0.0, (lease_until - utcnow()).total_seconds()))

    def _too_late(self, body: TransactionCreate, key: str, now: datetime) -> bool:
        """Expired, or older than the tombstone window (by captured_at, or by the time a
        UUIDv7 key was minted): such a request could outlive its tombstone (contract §3.5).
        An offline advice is exempt from ``expires_at`` (the terminal sold while the link
        was down; the customer has gone with the goods), not from the window."""
        expired = body.expires_at is not None and body.expires_at <= now
        if expired and not body.is_advice:
            return True
        oldest = now - timedelta(seconds=self.settings.tombstone_retention)
        if body.captured_at is not None and body.captured_at < oldest:
            return True
        minted = uuid7_time(key)
        return minted is not None and minted < oldest

    def _clock_skew(self, body: TransactionCreate, key: str, now: datetime) -> Outcome | None:
        """422 ``clock_skew`` for a time further ahead than the tolerance (contract §3.5): the age
        of a request is judged on the server's clock, and a terminal whose clock runs ahead
        must not carry a request past the tombstone that fenced it. Nothing is stored."""
        latest = now + timedelta(seconds=self.settings.clock_skew_tolerance)
        minted = uuid7_time(key)
        if body.captured_at is not None and body.captured_at > latest:
            field = "captured_at"
        elif minted is not None and minted > latest:
            field = "the Idempotency-Key's UUIDv7 time"
        else:
            return None
        error = ClockSkewError(
            f"{field} is more than {self.settings.clock_skew_tolerance:g} s ahead of the "
            "server's clock; correct the terminal's clock (nothing was stored under the key)."
        )
        return from_error(
            error,
            event=RequestOutcome.REJECTED,
            idempotency_status=IdempotencyStatus.NOT_FOUND,
            terminal_id=body.terminal_id,
        )

    async def _claim_and_drive(
        self,
        merchant_id: str,
        key: str,
        body: TransactionCreate,
        fingerprint: str,
        now: datetime,
        guard: Guard | None = None,
    ) -> Outcome | None:
        """Phase 1 in its own transaction (the key as ``processing``, lease token 1), then
        phases 2–3 (``drive``). None when the key existed: nothing was claimed. With the
        guard on, its check is in the claim's transaction, before the issuer call: a new key
        it refuses is not claimed (the claim rolls back) and the issuer is never asked."""
        suspect = None
        async with atomic(self.engine) as conn:
            if guard is not None:
                suspect = await self._suspect(conn, guard, merchant_id, key, body, now)
                if suspect is not None and guard.allow:
                    body = _overridden(body)
            claimed = await store.claim(
                conn,
                merchant_id=merchant_id,
                key=key,
                fingerprint=fingerprint,
                request=body.stored_request(),
                terminal_id=body.terminal_id,
                now=now,
                lease_s=self.settings.lease_seconds,
                deadline_s=self.settings.issuer_deadline,
            )
            refused = claimed and suspect is not None and not body.allow_duplicate
            if refused:
                await conn.rollback()  # the claim is undone: nothing stored under the key
        if not claimed:
            return None
        if refused and suspect is not None:
            return blocked(suspect, body.terminal_id)
        await self.cache.mark_busy(merchant_id, key, fingerprint)
        return await self.drive(
            merchant_id, key, body, token=1, created_at=now, event=RequestOutcome.CREATED
        )

    async def _process_inline(
        self,
        merchant_id: str,
        key: str,
        body: TransactionCreate,
        fingerprint: str,
        now: datetime,
        guard: Guard | None = None,
    ) -> Outcome | None:
        """Phases 1–3 in one transaction: the issuer enlists, the key is inserted already
        completed. None when the key existed: everything (issuer record included) is
        rolled back. With the guard on, its check comes first, in the same transaction:
        a new key it refuses is rolled back before the issuer is asked."""
        async with atomic(self.engine) as conn:
            if guard is not None:
                suspect = await self._suspect(conn, guard, merchant_id, key, body, now)
                if suspect is not None and not guard.allow:
                    known = await store.get(conn, merchant_id, key) is not None
                    await conn.rollback()  # atomic() then has nothing left to commit
                    return None if known else blocked(suspect, body.terminal_id)
                if suspect is not None:
                    body = _overridden(body)
            auth = await self.issuer.authorize(self.auth_request(merchant_id, key, body), conn=conn)
            txn = self.new_transaction(merchant_id, key, body, auth, created_at=now)
            text = repository.render(txn)
            inserted = await store.insert_completed(
                conn,
                merchant_id=merchant_id,
                key=key,
                fingerprint=fingerprint,
                terminal_id=body.terminal_id,
                now=now,
                response_body=text,
            )
            if not inserted:
                await conn.rollback()  # atomic() then has nothing left to commit
                return None
            await repository.insert_transaction(conn, txn)
            await self._announce(conn, txn)
        outcome = _created(text.encode(), RequestOutcome.CREATED, body.terminal_id)
        await self.remember(merchant_id, key, fingerprint, outcome)
        return outcome

    async def _announce(self, conn: AsyncConnection, txn: repository.NewTransaction) -> None:
        await outbox.append(
            conn,
            merchant_id=txn.merchant_id,
            event_type=outbox.COMPLETED,
            transaction_id=txn.id,
            data=repository.body_of(txn),
            now=txn.processed_at,
        )

    def auth_request(
        self, merchant_id: str, key: str, body: TransactionCreate
    ) -> AuthorizationRequest:
        return AuthorizationRequest(
            merchant_id=merchant_id,
            issuer_key=self.issuer_key(merchant_id, key),
            card_token=body.card.token,
            amount=body.amount,
            currency=body.currency,
            type=body.type,
        )

    def new_transaction(
        self,
        merchant_id: str,
        key: str,
        body: TransactionCreate,
        auth: Authorization,
        *,
        created_at: datetime,
    ) -> repository.NewTransaction:
        return repository.NewTransaction(
            merchant_id=merchant_id,
            id=key,
            terminal_id=body.terminal_id,
            type=body.type,
            amount=body.amount,
            currency=body.currency,
            card_last4=body.card.last4,
            card_brand=body.card.brand,
            card_fingerprint=self.card_fingerprint(body.card.token),
            installments=body.installments,
            status="approved" if auth.approved else "declined",
            decline_reason=auth.decline_reason,
            authorization_code=auth.authorization_code,
            captured_at=body.captured_at,
            created_at=created_at,
            processed_at=utcnow(),
            offline=body.is_advice,
            duplicate_override=body.allow_duplicate,  # set by the guard only (``_guard``)
            metadata_json=(
                json.dumps(body.metadata, separators=(",", ":")) if body.metadata else None
            ),
        )

    async def _finish(
        self,
        conn: AsyncConnection,
        merchant_id: str,
        key: str,
        body: TransactionCreate,
        auth: Authorization,
        token: int,
        created_at: datetime,
    ) -> str | None:
        """Phase 3: stored response, transaction and ledger, or nothing if the lease is gone."""
        txn = self.new_transaction(merchant_id, key, body, auth, created_at=created_at)
        text = repository.render(txn)
        won = await store.complete(
            conn,
            merchant_id=merchant_id,
            key=key,
            token=token,
            now=txn.processed_at,
            response_status=201,
            response_body=text,
        )
        if not won:
            return None
        await repository.insert_transaction(conn, txn)
        await self._announce(conn, txn)
        return text

    async def drive(
        self,
        merchant_id: str,
        key: str,
        body: TransactionCreate,
        *,
        token: int,
        created_at: datetime,
        event: RequestOutcome,
    ) -> Outcome:
        """Phases 2–3 for a key we own (lease ``token``): call the issuer with no
        transaction open, then the final write guarded by the token."""
        auth = await self._authorize(merchant_id, key, body, token)
        if auth is None:  # no answer in time: the server finishes it (202)
            return self.processing(key, body.terminal_id, event)
        # Before the commit: its NOTIFY wakes waiting duplicates, whose look must not be
        # answered by the busy hint (a duplicate meanwhile reads the row: still 409).
        await self.cache.clear_busy(merchant_id, key)
        async with atomic(self.engine) as conn:
            text = await self._finish(conn, merchant_id, key, body, auth, token, created_at)
        await self.refresh_epoch()
        if text is None:
            return await self._answer_after_lost_lease(merchant_id, key, body, event)
        outcome = _created(text.encode(), event, body.terminal_id)
        await self.remember(merchant_id, key, body_fingerprint(body), outcome)
        return outcome

    async def _authorize(
        self, merchant_id: str, key: str, body: TransactionCreate, token: int
    ) -> Authorization | None:
        """Phase 2. None when the issuer did not answer in time: the lease is handed over
        (the completer, or a retry, re-drives the key with the same issuer key)."""
        IN_FLIGHT.inc()
        try:
            return await asyncio.wait_for(
                self.issuer.authorize(self.auth_request(merchant_id, key, body)),
                timeout=self.settings.issuer_timeout,
            )
        except TimeoutError:
            await self._hand_over(merchant_id, key, token)
            return None
        except BaseException:
            await self._hand_over(merchant_id, key, token)
            raise
        finally:
            IN_FLIGHT.dec()

    async def _answer_after_lost_lease(
        self, merchant_id: str, key: str, body: TransactionCreate, event: RequestOutcome
    ) -> Outcome:
        """Someone took the key over while the issuer answered us: the winner's result."""
        record = await self.must_read(merchant_id, key)
        if record.state == KeyState.ABORTED:  # fenced while we waited: void the late answer
            await self._void_late_answer(merchant_id, key, body)
        if record.state == KeyState.PROCESSING:  # re-driven by its new owner: the server
            return self.processing(key, body.terminal_id, event)  # finishes it (202)
        return await self.existing(record, record.fingerprint or "")

    async def _void_late_answer(self, merchant_id: str, key: str, body: TransactionCreate) -> None:
        """Best effort: the fence already voided within its own commit (``recovery.fence``)
        and announced ``transaction.aborted``; this only repeats the void for our answer."""
        try:
            await self.issuer.void(
                self.issuer_key(merchant_id, key),
                merchant_id=merchant_id,
                amount=body.amount,
                currency=body.currency,
            )
        except Exception as exc:
            LATE_VOID_FAILURES.inc()
            log.warning("late_void_failed", error=type(exc).__name__, key=key)

    async def _hand_over(self, merchant_id: str, key: str, token: int) -> None:
        """Expire our lease now so the completer (or a retry) re-drives the key."""
        await self.cache.clear_busy(merchant_id, key)
        try:
            async with atomic(self.engine) as conn:
                await store.release(
                    conn, merchant_id=merchant_id, key=key, token=token, until=utcnow()
                )
        except Exception:  # storage down: the lease simply runs out on its own
            return

    async def _fence_expired(
        self,
        merchant_id: str,
        key: str,
        body: TransactionCreate,
        fingerprint: str,
        now: datetime,
    ) -> Outcome:
        error = RequestExpiredError(
            "The request arrived after its expires_at, or its captured_at is older than the "
            "retention window; the key is fenced and will never be processed."
        )
        outcome = from_error(
            error,
            event=RequestOutcome.EXPIRED,
            idempotency_status=IdempotencyStatus.EXPIRED,
            terminal_id=body.terminal_id,
        )
        async with atomic(self.engine) as conn:
            fenced = await store.fence(
                conn,
                merchant_id=merchant_id,
                key=key,
                state=KeyState.EXPIRED,
                now=now,
                fingerprint=fingerprint,
                terminal_id=body.terminal_id,
                response_status=410,
                response_body=outcome.body.decode(),
            )
        if fenced:
            return outcome
        return await self.existing(await self.must_read(merchant_id, key), fingerprint)

    # ---------------------------------------------------------- existing keys
    async def existing(self, record: KeyRecord, fingerprint: str) -> Outcome:
        """Answer from a key that exists: 410 when fenced, 422 for another body, the replay
        when completed, 409 while its lease is live — else recover it now."""
        terminal = record.terminal_id
        if record.state == KeyState.ABORTED:
            return from_error(
                TransactionAbortedError(ABORTED_DETAIL),
                event=RequestOutcome.ABORTED,
                idempotency_status=IdempotencyStatus.ABORTED,
                terminal_id=terminal,
            )
        if record.state == KeyState.EXPIRED:
            body = (record.response_body or "").encode()
            return Outcome(
                410,
                body,
                RequestOutcome.EXPIRED,
                IdempotencyStatus.EXPIRED,
                problem=True,
                terminal_id=terminal,
            )
        if record.fingerprint != fingerprint:
            completed = record.state == KeyState.COMPLETED
            status = IdempotencyStatus.PROCESSED if completed else IdempotencyStatus.IN_PROGRESS
            return _key_reused(status, terminal)
        if record.state == KeyState.COMPLETED:
            outcome = self._answer_completed(
                record.fingerprint,
                fingerprint,
                record.response_status or 201,
                (record.response_body or "").encode(),
                terminal,
            )
            await self.remember(record.merchant_id, record.key, fingerprint, outcome)
            return outcome
        now = utcnow()
        if record.lease_live(now):
            return self._in_progress(terminal, lease_until=record.lease_until)
        recovered = await recovery.recover(self, record, now=now)  # its owner vanished
        if recovered.outcome is not None:
            return recovered.outcome
        # Another taker won, or the key was settled past its deadline: the row as it is now.
        again = await self.must_read(record.merchant_id, record.key)
        return await self.existing(again, record.fingerprint or "")


def _advice_too_old(terminal_id: str) -> Outcome:
    """422 ``advice_too_old``: nothing is stored under the key — a key older than the window
    may have outlived its tombstone, so it is never processed; the merchant reconciles."""
    error = AdviceTooOldError(
        "The offline advice was captured longer ago than the retention window (or its key "
        "was minted then); it is not processed and nothing was stored. Reconcile it."
    )
    return from_error(
        error,
        event=RequestOutcome.REJECTED,
        idempotency_status=IdempotencyStatus.NOT_FOUND,
        terminal_id=terminal_id,
    )


def _overridden(body: TransactionCreate) -> TransactionCreate:
    """The guard found a suspect and the cashier confirmed: the transaction records it."""
    return body.model_copy(update={"allow_duplicate": True})


def _created(body: bytes, event: RequestOutcome, terminal_id: str | None) -> Outcome:
    return Outcome(201, body, event, IdempotencyStatus.CREATED, terminal_id=terminal_id)
