"""Create: the atomic phases (SPEC §2–3, DESIGN.md "Create").

phase 1  claim the key (unique index)           ┐ one transaction when the issuer answers
phase 2  authorize with the derived issuer key  │ inline (the simulator's instant tokens);
phase 3  transaction + ledger + stored response ┘ otherwise three steps, no transaction
                                                  open across the issuer call, and the final
                                                  write guarded by the lease token.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import time
from datetime import datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from api.config import Settings
from api.db import atomic, utcnow
from api.errors import ApiError
from api.idempotency import store
from api.idempotency.cache import ResponseCache
from api.idempotency.epoch import read_epoch
from api.idempotency.keys import body_fingerprint, uuid7_time
from api.idempotency.store import KeyRecord
from api.metrics import IN_FLIGHT
from api.outbox import writer as outbox
from api.transactions import inline as one_write
from api.transactions import repository
from api.transactions.issuer import (
    Authorization,
    AuthorizationRequest,
    Issuer,
    derive_issuer_key,
)
from api.transactions.outcome import Outcome, from_error, key_state_body
from api.transactions.schemas import TransactionCreate


def _key_reused(idempotency_status: str, terminal_id: str | None) -> Outcome:
    return from_error(
        ApiError(
            422,
            "idempotency_key_reused",
            "This Idempotency-Key was used with a different request body.",
        ),
        event="key_reused",
        idempotency_status=idempotency_status,
        terminal_id=terminal_id,
    )


EPOCH_RECHECK_SECONDS = 5.0


class _KeyTaken(Exception):
    """Another request inserted the key first: roll back and answer from its row."""


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
        """Bind the cache to the database's epoch (SPEC §3.6); keep the known one if the
        database does not answer in time."""
        try:
            async with asyncio.timeout(self.settings.db_timeout), self.reader.connect() as conn:
                self.cache.bind_epoch(await read_epoch(conn))
        except Exception:  # storage down: the cache stays bound to what we knew (or off)
            return

    async def refresh_epoch(self) -> None:
        """Before using the cache: the first time, wait for the epoch; after that re-read it
        every few seconds in the background, so a running server follows a new epoch."""
        if not self.cache.enabled or time.monotonic() < self._epoch_due:
            return
        self._epoch_due = time.monotonic() + EPOCH_RECHECK_SECONDS
        if self.cache.epoch is None:
            await self.bind_epoch()
        elif self._epoch_task is None or self._epoch_task.done():
            self._epoch_task = asyncio.create_task(self.bind_epoch())

    def retry_after(self) -> dict[str, str]:
        return {"Retry-After": str(self.settings.retry_after_seconds)}

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

    def processing(self, key: str, terminal_id: str | None, event: str) -> Outcome:
        return Outcome(
            202,
            key_state_body(key, "processing"),
            event,
            "in_progress",
            self.retry_after(),
            terminal_id=terminal_id,
        )

    # ------------------------------------------------------------------ create
    async def create(
        self, merchant_id: str, key: str, body: TransactionCreate, fingerprint: str
    ) -> Outcome:
        await self.refresh_epoch()
        cached, busy = await self.cache.before_create(merchant_id, key)
        if cached is not None:  # a committed answer: replay it, or refuse a different body
            return self._answer_completed(
                cached.fingerprint, fingerprint, cached.status, cached.body, cached.terminal_id
            )
        if busy == fingerprint:
            return self._in_progress(body.terminal_id)
        if self._fits_one_write(body, key, start := utcnow()):
            written = await self._create_in_one_write(merchant_id, key, body, fingerprint, start)
            if written is not None:
                return written
        record = await self.read(merchant_id, key)  # one autocommit round trip on Postgres
        now = utcnow()
        if record is None and (skew := self._clock_skew(body, key, now)) is not None:
            return skew
        claimed = False
        outcome: Outcome | None = None
        if record is None and not self._too_late(body, key, now):
            try:
                async with atomic(self.engine) as conn:
                    if self.issuer.answers_inline(body.card.token):
                        outcome = await self._process_inline(
                            conn, merchant_id, key, body, fingerprint, now
                        )
                    else:
                        request = body.model_dump_json()
                        claimed = await self._claim(
                            conn, merchant_id, key, body, fingerprint, request, now
                        )
                        if not claimed:
                            raise _KeyTaken
            except _KeyTaken:  # a concurrent request won the key between our read and insert
                record = await self._must_read(merchant_id, key)
        if outcome is not None:
            await self.remember(merchant_id, key, fingerprint, outcome)
            return outcome
        if claimed:
            await self.cache.mark_busy(merchant_id, key, fingerprint)
            return await self.drive(
                merchant_id, key, body, token=1, created_at=now, event="created"
            )
        if record is not None:
            return await self.existing(record, fingerprint)
        return await self._fence_expired(merchant_id, key, body, fingerprint, now)

    def _fits_one_write(self, body: TransactionCreate, key: str, now: datetime) -> bool:
        """An inline token whose times need no judging: the common create."""
        if self.inline is None or not self.issuer.answers_inline(body.card.token):
            return False
        return self._clock_skew(body, key, now) is None and not self._too_late(body, key, now)

    async def _create_in_one_write(
        self, merchant_id: str, key: str, body: TransactionCreate, fingerprint: str, now: datetime
    ) -> Outcome | None:
        """Phases 1–3 as one write (api/transactions/inline.py). The key existed: the answer
        from its row. None when nothing was written and the row is not known yet: the general
        path reads it and answers from it."""
        assert self.inline is not None
        rows = one_write.build(self, merchant_id, key, body, fingerprint, now)
        written = await self.inline.create(rows)
        if isinstance(written, KeyRecord):  # the key exists: replay, 409, 410 or 422
            return await self.existing(written, fingerprint)
        if not written:
            return None
        text = rows.response_body.encode()
        outcome = Outcome(201, text, "created", "created", terminal_id=body.terminal_id)
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
            created=outcome.event == "created",
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
            return _key_reused("processed", terminal_id)
        return Outcome(
            status,
            body,
            "replayed",
            "replayed",
            {"Idempotent-Replayed": "true"},
            terminal_id=terminal_id,
        )

    def _in_progress(self, terminal_id: str | None) -> Outcome:
        return from_error(
            ApiError(
                409,
                "request_in_progress",
                "A request with this key is being processed; retry after Retry-After.",
                headers=self.retry_after(),
            ),
            event="in_progress",
            idempotency_status="in_progress",
            terminal_id=terminal_id,
        )

    def _too_late(self, body: TransactionCreate, key: str, now: datetime) -> bool:
        """Expired, or older than the tombstone window (by captured_at, or by the time a
        UUIDv7 key was minted): such a request could outlive its tombstone (SPEC §3.5)."""
        if body.expires_at is not None and body.expires_at <= now:
            return True
        oldest = now - timedelta(seconds=self.settings.tombstone_retention)
        if body.captured_at is not None and body.captured_at < oldest:
            return True
        minted = uuid7_time(key)
        return minted is not None and minted < oldest

    def _clock_skew(self, body: TransactionCreate, key: str, now: datetime) -> Outcome | None:
        """422 ``clock_skew`` for a time further ahead than the tolerance (SPEC §3.5): the age
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
        error = ApiError(
            422,
            "clock_skew",
            f"{field} is more than {self.settings.clock_skew_tolerance:g} s ahead of the "
            "server's clock; correct the terminal's clock (nothing was stored under the key).",
        )
        return from_error(
            error, event="rejected", idempotency_status="not_found", terminal_id=body.terminal_id
        )

    async def _claim(
        self,
        conn: AsyncConnection,
        merchant_id: str,
        key: str,
        body: TransactionCreate,
        fingerprint: str,
        request: str,
        now: datetime,
    ) -> bool:
        return await store.claim(
            conn,
            merchant_id=merchant_id,
            key=key,
            fingerprint=fingerprint,
            request=request,
            terminal_id=body.terminal_id,
            now=now,
            lease_s=self.settings.lease_seconds,
            deadline_s=self.settings.issuer_deadline,
        )

    async def _must_read(self, merchant_id: str, key: str) -> KeyRecord:
        record = await self.read(merchant_id, key)
        if record is None:  # a key row is never deleted while a request can still use it
            raise RuntimeError("claimed key vanished")
        return record

    async def _process_inline(
        self,
        conn: AsyncConnection,
        merchant_id: str,
        key: str,
        body: TransactionCreate,
        fingerprint: str,
        now: datetime,
    ) -> Outcome:
        """Phases 1–3 in one transaction: the issuer enlists, the key is inserted already
        completed, and a lost insert race rolls everything back (issuer record included)."""
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
            raise _KeyTaken
        await repository.insert_transaction(conn, txn)
        await self._announce(conn, txn)
        return Outcome(201, text.encode(), "created", "created", terminal_id=body.terminal_id)

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
        event: str,
    ) -> Outcome:
        """Phases 2–3 for a key we own: call the issuer (no transaction open), then finish."""
        IN_FLIGHT.inc()
        try:
            auth = await asyncio.wait_for(
                self.issuer.authorize(self.auth_request(merchant_id, key, body)),
                timeout=self.settings.issuer_timeout,
            )
        except TimeoutError:
            await self._hand_over(merchant_id, key, token)
            return self.processing(key, body.terminal_id, event)
        except BaseException:
            await self._hand_over(merchant_id, key, token)
            raise
        finally:
            IN_FLIGHT.dec()
        async with atomic(self.engine) as conn:
            text = await self._finish(conn, merchant_id, key, body, auth, token, created_at)
        await self.refresh_epoch()
        await self.cache.clear_busy(merchant_id, key)
        if text is None:  # someone took the key over: answer with the winner's result
            record = await self._must_read(merchant_id, key)
            if record.state == store.ABORTED:  # fenced while we waited: void the late answer
                with contextlib.suppress(Exception):
                    await self.issuer.void(
                        self.issuer_key(merchant_id, key),
                        amount=body.amount,
                        currency=body.currency,
                    )
            if record.state == store.PROCESSING:  # re-driven by its new owner: the server
                return self.processing(key, body.terminal_id, event)  # finishes it (202)
            return await self.existing(record, record.fingerprint or "")
        outcome = Outcome(201, text.encode(), event, "created", terminal_id=body.terminal_id)
        await self.remember(merchant_id, key, body_fingerprint(body), outcome)
        return outcome

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
        error = ApiError(
            410,
            "request_expired",
            "The request arrived after its expires_at, or its captured_at is older than the "
            "retention window; the key is fenced and will never be processed.",
        )
        outcome = from_error(
            error, event="expired", idempotency_status="expired", terminal_id=body.terminal_id
        )
        async with atomic(self.engine) as conn:
            fenced = await store.fence(
                conn,
                merchant_id=merchant_id,
                key=key,
                state=store.EXPIRED,
                now=now,
                fingerprint=fingerprint,
                terminal_id=body.terminal_id,
                response_status=410,
                response_body=outcome.body.decode(),
            )
        if fenced:
            return outcome
        return await self.existing(await self._must_read(merchant_id, key), fingerprint)

    # ---------------------------------------------------------- existing keys
    async def existing(self, record: KeyRecord, fingerprint: str) -> Outcome:
        terminal = record.terminal_id
        if record.state == store.ABORTED:
            return from_error(
                ApiError(
                    410,
                    "transaction_aborted",
                    "The key was fenced by an abort; it was not and will not be processed.",
                ),
                event="aborted",
                idempotency_status="aborted",
                terminal_id=terminal,
            )
        if record.state == store.EXPIRED:
            body = (record.response_body or "").encode()
            return Outcome(410, body, "expired", "expired", problem=True, terminal_id=terminal)
        if record.fingerprint != fingerprint:
            status = "processed" if record.state == store.COMPLETED else "in_progress"
            return _key_reused(status, terminal)
        if record.state == store.COMPLETED:
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
            return self._in_progress(terminal)
        return await self._recover_inline(record, now)

    async def _recover_inline(self, record: KeyRecord, now: datetime) -> Outcome:
        """A retry found a key whose owner vanished: take it over and re-drive it now."""
        async with atomic(self.engine) as conn:
            token = await store.take_over(
                conn, record, now=now, lease_s=self.settings.lease_seconds
            )
        if token is None:
            return await self.existing(
                await self._must_read(record.merchant_id, record.key), record.fingerprint or ""
            )
        if await self.settle(record, token, now) is None:
            return await self.existing(
                await self._must_read(record.merchant_id, record.key), record.fingerprint or ""
            )
        body = TransactionCreate.model_validate_json(record.request or "{}")
        return await self.drive(
            record.merchant_id,
            record.key,
            body,
            token=token,
            created_at=record.created_at,
            event="created",
        )

    async def settle(self, record: KeyRecord, token: int, now: datetime) -> int | None:
        """Past the issuer deadline, void the issuer call and fence the key as aborted.

        Returns the token when the key is still ours to drive, None when it was settled.
        """
        if record.deadline_at is None or now < record.deadline_at:
            return token
        await self.fence_owned(record, token)
        return None

    async def fence_owned(self, record: KeyRecord, token: int) -> None:
        """Turn a key we own into an aborted tombstone and void its issuer call, in one
        transaction with its outbox event: fence and void commit together or not at all
        (voiding first, in its own commit, let a stalled owner void an authorization and
        then lose the key — found by the SPIN model, docs/protocol/). A remote acquirer
        connector that cannot enlist voids from the ``transaction.aborted`` outbox event."""
        now = utcnow()
        request = TransactionCreate.model_validate_json(record.request or "{}")
        fenced = False
        async with atomic(self.engine) as conn:
            if await store.fence_owned(
                conn, merchant_id=record.merchant_id, key=record.key, token=token, now=now
            ):
                fenced = True
                await self.issuer.void(
                    self.issuer_key(record.merchant_id, record.key),
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
                )
        if fenced:
            await self.refresh_epoch()
            await self.cache.mark_fenced(record.merchant_id, record.key)
