"""Create: the atomic phases (contract §2–3, DESIGN.md "Create").

phase 1  claim the key (unique index), durable before anything leaves
phase 2  one 0200 to the acquirer over the link, no transaction open (``acquire.py``)
phase 3  transaction + ledger + stored response, guarded by the lease token — or, in doubt,
         declined / acquirer_timeout with its 0420 reversal advice queued in the same commit
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Coroutine, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import structlog
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from api import deferred
from api.acquirer.messages import rrn_for
from api.acquirer.types import Authorization, AuthorizationRequest
from api.config import Settings
from api.db import atomic, utcnow
from api.errors import (
    AdviceTooOldError,
    ClockSkewError,
    IdempotencyKeyReusedError,
    RequestExpiredError,
    RequestInProgressError,
    ServiceUnavailableError,
    TransactionAbortedError,
)
from api.events.writer import RequestOutcome
from api.idempotency import store
from api.idempotency.cache import ResponseCache
from api.idempotency.epoch import read_epoch
from api.idempotency.keys import body_fingerprint, uuid7_time
from api.idempotency.store import KeyRecord, KeyState
from api.models import IdempotencyKey
from api.outbox import writer as outbox
from api.storage_errors import end_unseen, storage_unavailable
from api.transactions import acquire, delegated, recovery, repository, unknown_outcome
from api.transactions import inline as hot_path
from api.transactions.group_commit import GroupCommit, InsertIfAbsent
from api.transactions.guard import Guard, blocked, find_suspect, lock_key
from api.transactions.outcome import IdempotencyStatus, Outcome, from_error, key_state_body
from api.transactions.schemas import TransactionCreate

log = structlog.get_logger("idempay.service")
EPOCH_RECHECK_SECONDS = 5.0
# A claim waits at most this long for a key's row (or the guard's lock) another transaction
# holds: past it the create is answered from the key (``_claim_held``), and a pool connection
# is never parked behind a stalled holder.
CLAIM_LOCK_TIMEOUT = "SET LOCAL lock_timeout = '250ms'"
FINISH_LOCK_TIMEOUT = "SET LOCAL lock_timeout = '1s'"
CITUS_PROPAGATE_SET_LOCAL = "SET LOCAL citus.propagate_set_commands = 'local'"
CLAIM_TIME_STEP = timedelta(milliseconds=10)  # claim times stay unique within this (below)
CLAIM_MARK_US = 1_000_000  # a claim's lease end carries a random mark below this (µs)
GUARD_HELD_DETAIL = (
    "Another sale of this card and amount is being processed at this terminal; nothing was "
    "processed under this key. Retry with the same key."
)
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
        acquirer: acquire.Acquirer,
        settings: Settings,
        *,
        cache: ResponseCache | None = None,
        inline: hot_path.HotReads | None = None,
        citus: bool = False,
        delegate: bool = False,
    ) -> None:
        self.engine = engine
        # On Citus a batch holds one merchant's writes: a single-shard transaction.
        self._by_merchant = citus
        # Reads need no transaction: on Postgres an AUTOCOMMIT connection answers a replay or a
        # lookup in one round trip instead of BEGIN/SELECT/ROLLBACK; on SQLite a plain BEGIN
        # (a WAL snapshot) instead of the writers' BEGIN IMMEDIATE, so reads take no lock.
        self.reader = (
            engine.execution_options(isolation_level="AUTOCOMMIT")
            if engine.dialect.name == "postgresql"
            else engine.execution_options(sqlite_deferred_begin=True)
        )
        # The hot path's key reads, without SQLAlchemy (api/transactions/inline.py).
        self.inline = inline
        self.acquirer = acquirer
        self._secret = settings.secret_key.encode()
        # Phase 2–3 work that outlived its create's answer (202): the server finishes it.
        self._background: set[asyncio.Task[Outcome]] = set()
        self.settings = settings
        self.cache = cache or ResponseCache(None, prefix="", ttl=1, lookup_ttl=1, busy_ttl=1)
        self._epoch_due = 0.0
        self._suspect_due = 0.0  # the next re-read a foreign announcement may start inline
        self._epoch_task: asyncio.Task[str | None] | None = None
        self._epoch_reads = 0  # epoch reads started (``bind_epoch``)
        self._epoch_read_bound = 0  # the latest-started read whose epoch is bound
        self._last_claim_at = utcnow()
        # Group commit (api/transactions/group_commit.py): many claims per commit, many
        # finishes per commit; a guarded claim keeps a transaction of its own.
        lanes, max_lanes = _lanes(engine, settings.group_commit_lanes)
        postgres = engine.dialect.name == "postgresql"
        # On Citus a SET LOCAL stays on the coordinator unless told to go to the workers,
        # where the key's row is locked: the lock timeouts must reach them.
        self._set_local: tuple[str, ...] = (CITUS_PROPAGATE_SET_LOCAL,) if citus else ()
        self.claims: GroupCommit[bool] = GroupCommit(
            engine,
            kind="claim",
            lanes=lanes,
            max_lanes=max_lanes,
            # a held key waits this long
            prologue=(*self._set_local, CLAIM_LOCK_TIMEOUT) if postgres else None,
            new_key=True,
            queue_timeout=settings.db_timeout,
            # the batch's claims in one INSERT (each learns from RETURNING if it went in)
            together=True,
            # Citus with the delegated calls installed: a batch is one call (delegated.py)
            delegate=delegate,
        )
        self.finishes: GroupCommit[str | None] = GroupCommit(
            engine,
            kind="finish",
            lanes=lanes,
            max_lanes=max_lanes,
            # a key held by another transaction (an operator's) fails its own finish — the
            # key is settled in doubt after its lease — and never holds its batch-mates
            prologue=(*self._set_local, FINISH_LOCK_TIMEOUT) if postgres else None,
            queue_timeout=settings.db_timeout,
            # the finishes' inserts (transaction, ledger, outbox) one statement per table
            defer_inserts=True,
            # and their keys completed in one UPDATE (``Finish``, Postgres)
            together=True,
            delegate=delegate,
        )

    # ----------------------------------------------------------------- helpers
    def partition_of(self, merchant_id: str) -> str | None:
        """The group-commit partition of a merchant's writes: the merchant on Citus (one
        shard per batch), none elsewhere."""
        return merchant_id if self._by_merchant else None

    def _claim_time(self) -> datetime:
        """Now, strictly later than any claim time this process gave before: a claim whose
        end was unseen is recognised as ours by its fingerprint and claim time
        (``_claim_unseen``), so two creates of one key and body — in one batch of claims —
        must never share a claim time, or both would take the row for theirs and both send
        a 0200. A wall clock stepped back further than ``CLAIM_TIME_STEP`` is followed as it
        is (leases and ages stay on the clock); claims of one moment still differ."""
        now = utcnow()
        if now <= self._last_claim_at < now + CLAIM_TIME_STEP:
            now = self._last_claim_at + timedelta(microseconds=1)
        self._last_claim_at = now
        return now

    def _lease_until(self, now: datetime) -> datetime:
        """The lease of a claim made at ``now``. It outlives the 0200's timeout (no one
        settles a key whose answer may still come to its owner) by ``IDEMPAY_LEASE_SECONDS``
        plus a random mark of up to ``CLAIM_MARK_US`` µs: a claim whose end was unseen is
        ours only if its row has our claim time *and* our lease end, so two processes' claims
        of one key and body at the same microsecond (both ends unseen) are told apart all
        but once in a million — within one process the claim time alone is unique."""
        lease_s = self.settings.acquirer_timeout + self.settings.lease_seconds
        mark = secrets.randbelow(CLAIM_MARK_US)
        return now + timedelta(seconds=lease_s, microseconds=mark)

    async def bind_epoch(self) -> str | None:
        """Bind the cache to the database's epoch (contract §3.6) and return it; keep the
        known one (and return None) if the database does not answer in time."""
        self._epoch_reads += 1
        started = self._epoch_reads
        try:
            epoch = await self._database_epoch()
        except Exception:  # storage down: the cache stays bound to what we knew (or off)
            return None
        if started < self._epoch_read_bound:  # a later-started read bound first: never go
            return epoch  # back to an epoch it may have replaced (contract §3.6)
        self._epoch_read_bound = started
        self.cache.bind_epoch(epoch)
        # the marker the cache's reads need (api/idempotency/cache.py)
        if epoch is not None and await self.cache.confirm_epoch(epoch):
            return await self._announced(epoch)
        return epoch

    async def _database_epoch(self) -> str | None:
        """The database's epoch, read now (bounded by ``IDEMPAY_DB_TIMEOUT``)."""
        async with asyncio.timeout(self.settings.db_timeout), self.reader.connect() as conn:
            return await read_epoch(conn)

    async def _announced(self, epoch: str) -> str | None:
        """This server announced ``epoch`` (the marker was missing). It was read before the
        announcement: a new-epoch committed in between, its marker lost (Redis restarted from
        an older snapshot) before ours landed, would leave the OLD epoch announced and every
        server still on it serving the restored-away entries for the marker's life. So the
        database is asked again: still ``epoch`` → done; another → the announcement is
        withdrawn and the new epoch read, bound and announced; no answer → withdrawn (nothing
        is served from the cache until an epoch is announced again). Contract §3.6."""
        try:
            now = await self._database_epoch()
        except Exception:  # storage down: an announcement nobody confirmed is taken back
            await self.cache.withdraw_epoch(epoch)
            return epoch
        if now == epoch:
            return epoch
        await self.cache.withdraw_epoch(epoch)
        return await self.bind_epoch()

    async def refresh_epoch(self) -> None:
        """Before using the cache: the first time, wait for the epoch; after that re-read it
        every few seconds in the background, so a running server follows a new epoch."""
        # Another epoch is announced: re-read it before serving — once per recheck interval,
        # not per request. Until the announcement names this server's epoch the cache serves
        # nothing anyway (a marker left naming an epoch the database no longer holds stays
        # until an operator's new-epoch or its expiry: without the limit, every request on
        # every server read the database's epoch meanwhile).
        suspect = self.cache.enabled and self.cache.epoch_suspect
        if suspect and time.monotonic() >= self._suspect_due:
            self._suspect_due = time.monotonic() + EPOCH_RECHECK_SECONDS
            await self.bind_epoch()
            self._epoch_due = time.monotonic() + EPOCH_RECHECK_SECONDS
            return
        if not self.cache.enabled or time.monotonic() < self._epoch_due:
            return
        self._epoch_due = time.monotonic() + EPOCH_RECHECK_SECONDS
        if self.cache.epoch is None:
            await self.bind_epoch()
        elif self._epoch_task is None or self._epoch_task.done():
            self._epoch_task = asyncio.create_task(self.bind_epoch())

    def rrn(self, merchant_id: str, key: str) -> str:
        """The key's retrieval reference at the acquirer (field 37): stable across restarts."""
        return rrn_for(self._secret, merchant_id, key)

    @staticmethod
    def fingerprint_of(body: TransactionCreate) -> str:
        return body_fingerprint(body)

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
        """Claim → authorize over the link → finish. A committed answer in Redis first; then
        phase by phase (``_create_in_phases``). ``guard_s``: the merchant's duplicate
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
        (clock skew, age), then claimed and driven: claim, one 0200 (no transaction open),
        guarded finish.

        The key is read before it is claimed: a repeat of a stored key never joins a batch of
        claims, where a row another transaction holds would stall its batch-mates by the lock
        timeout (tests/api/transactions/test_repeats_of_stored_keys.py, docs/scaling.md)."""
        epoch = self.cache.epoch  # before the read: a replay is cached under it (§3.6)
        record = await self.read(merchant_id, key)  # one autocommit round trip on Postgres
        now = self._claim_time()
        if record is not None:
            answer = self.existing(record, fingerprint, epoch=epoch)
            return await self._about_a_stored_key(answer, body)
        if (skew := self._clock_skew(body, key, now)) is not None:
            return skew
        if self._too_late(body, key, now):
            if body.is_advice:  # the terminal already sold: nothing to fence, report it
                return _advice_too_old(body.terminal_id)
            return await self._fence_expired(merchant_id, key, body, fingerprint, now)
        outcome = await self._claim_and_drive(merchant_id, key, body, fingerprint, now, guard)
        if outcome is None:  # a concurrent request won the key between our read and insert
            return await self._about_a_stored_key(
                self._existing_key(merchant_id, key, fingerprint), body
            )
        return outcome

    async def _existing_key(self, merchant_id: str, key: str, fingerprint: str) -> Outcome:
        epoch = self.cache.epoch
        return await self.existing(await self.must_read(merchant_id, key), fingerprint, epoch=epoch)

    async def _about_a_stored_key(
        self, answer: Coroutine[Any, Any, Outcome], body: TransactionCreate
    ) -> Outcome:
        """The answer about a key whose row exists (read, or claimed): a storage error on
        the way is 409 in flight (look it up), never 503 — "nothing was processed" is a
        guess about a key someone has claimed."""
        try:
            return await answer
        except Exception as exc:
            if not storage_unavailable(exc):
                raise
            return self._in_progress(body.terminal_id)

    async def remember(
        self,
        merchant_id: str,
        key: str,
        fingerprint: str,
        outcome: Outcome,
        *,
        epoch: str | None,
        announced: str | None = None,
    ) -> None:
        """After commit: let Redis answer the next replay (advisory, best effort). ``epoch``:
        the cache's epoch before the answer was committed or read (contract §3.6);
        ``announced``: its announcement then, for a creation's lookup entry (§3.7)."""
        await self.cache.put_response(
            merchant_id,
            key,
            fingerprint=fingerprint,
            status=outcome.status,
            body=outcome.body,
            terminal_id=outcome.terminal_id,
            epoch=epoch,
            created=outcome.event == RequestOutcome.CREATED,
            announced=announced,
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
        guard on, its check is in the claim's transaction, before the 0200 leaves: a new key
        it refuses is not claimed (the claim rolls back) and the acquirer is never asked."""
        written: list[bool] = []  # set once the claim's INSERT was sent
        lease_until = self._lease_until(now)
        try:
            claimed, refused, suspect, body = await self._claim(
                merchant_id, key, body, fingerprint, now, lease_until, guard, written
            )
        except Exception as exc:
            if _lock_not_available(exc):
                return await self._claim_held(merchant_id, key, body, fingerprint, guard)
            if not written or not self._end_unseen(exc):
                raise  # no connection, or nothing sent: nothing was written (503 is true)
            return await self._claim_unseen(merchant_id, key, body, fingerprint, now, lease_until)
        if not claimed:
            return None
        if refused and suspect is not None:
            return blocked(suspect, body.terminal_id)
        await self.cache.mark_busy(merchant_id, key, fingerprint)
        return await self.drive(
            merchant_id, key, body, token=1, created_at=now, event=RequestOutcome.CREATED
        )

    async def _claim_held(
        self,
        merchant_id: str,
        key: str,
        body: TransactionCreate,
        fingerprint: str,
        guard: Guard | None,
    ) -> Outcome:
        """The claim waited past its lock timeout (another transaction holds the key's row —
        an operator's UPDATE, a stalled create — or, with the guard on, the sale's guard
        lock): nothing was written. A committed row answers (replay, 409, 410, 422); none →
        409 in flight (Retry-After), or 503 for a guarded create, whose lock may be another
        key's (the lookup says 404: nothing was processed under this key). Unreadable
        (storage down) → 409: the key's row may be a create's in flight."""
        epoch = self.cache.epoch
        try:
            record = await self.read(merchant_id, key)
        except Exception as exc:  # the key's row may be held by a create in flight: 409
            if not storage_unavailable(exc):
                raise
            return self._in_progress(body.terminal_id)
        if record is not None:
            answer = self.existing(record, fingerprint, epoch=epoch)
            return await self._about_a_stored_key(answer, body)
        if guard is not None:
            return from_error(
                ServiceUnavailableError(GUARD_HELD_DETAIL),
                event=RequestOutcome.ERROR,
                idempotency_status=IdempotencyStatus.NOT_FOUND,
                terminal_id=body.terminal_id,
            )
        return self._in_progress(body.terminal_id)

    def _end_unseen(self, exc: BaseException) -> bool:
        """A storage error that does not prove the claim rolled back (Postgres: the
        connection lost mid-statement, the backend ended). SQLite's failed commit is a
        rollback."""
        if self.engine.dialect.name != "postgresql" or not storage_unavailable(exc):
            return False
        orig = getattr(exc, "orig", exc)
        return end_unseen(getattr(orig, "__cause__", None) or orig)

    async def _claim_unseen(
        self,
        merchant_id: str,
        key: str,
        body: TransactionCreate,
        fingerprint: str,
        now: datetime,
        lease_until: datetime,
    ) -> Outcome:
        """The claim's end was not seen (contract §2.2, "unknown outcomes"): read the key
        back. Our own claim (lease token 1, our fingerprint, claim time and lease end, which
        carries the claim's random mark) → drive it, the 0200 has not left; another's row →
        its answer; still absent or unreadable when the
        budget is spent → 409 in flight (the lookup tells), never a 503 that may be false."""

        async def reader(keys: Sequence[str]) -> unknown_outcome.ReadBack[str, KeyRecord]:
            try:
                record = await self.read(merchant_id, key)
            except Exception as exc:
                if storage_unavailable(exc):
                    raise unknown_outcome.CommitOutcomeUnknown("read back") from exc
                raise
            found = {key: record} if record is not None else {}
            return unknown_outcome.ReadBack(found, ended=False)

        def ours(_key: str, record: KeyRecord) -> bool:
            return (
                record.state == KeyState.PROCESSING
                and record.lease_token == 1
                and record.fingerprint == fingerprint
                and record.created_at == now
                and record.lease_until == lease_until
            )

        epoch = self.cache.epoch  # before any read-back
        (outcome,) = await unknown_outcome.resolve([key], reader, ours)
        if isinstance(outcome, unknown_outcome.Applied):
            if outcome.record.request:  # drive what the claim stored (the guard's override)
                body = TransactionCreate.model_validate_json(outcome.record.request)
            await self.cache.mark_busy(merchant_id, key, fingerprint)
            return await self.drive(
                merchant_id, key, body, token=1, created_at=now, event=RequestOutcome.CREATED
            )
        if isinstance(outcome, unknown_outcome.NotApplied) and outcome.record is not None:
            answer = self.existing(outcome.record, fingerprint, epoch=epoch)
            return await self._about_a_stored_key(answer, body)
        return self._in_progress(body.terminal_id)

    async def _claim(
        self,
        merchant_id: str,
        key: str,
        body: TransactionCreate,
        fingerprint: str,
        now: datetime,
        lease_until: datetime,
        guard: Guard | None,
        written: list[bool],
    ) -> tuple[bool, bool, str | None, TransactionCreate]:
        """Phase 1's transaction: (claimed, refused by the guard, suspect, body). ``written``
        gets an entry once the claim's INSERT is sent: from then on its end may be unseen."""

        def claim(body: TransactionCreate) -> InsertIfAbsent:
            row = store.claim_row(
                merchant_id=merchant_id,
                key=key,
                fingerprint=fingerprint,
                request=body.stored_request(),
                terminal_id=body.terminal_id,
                now=now,
                lease_until=lease_until,
                deadline_s=self.settings.issuer_deadline,
            )
            sent = lambda: written.append(True)  # noqa: E731
            return InsertIfAbsent(IdempotencyKey, row, store.CLAIM_IDENTITY, sent=sent)

        if guard is None:  # the common create: its row in a batch of claims
            work = claim(body)
            claimed = await self.claims.run(work, partition=self.partition_of(merchant_id))
            return claimed, False, None, body
        async with atomic(self.engine, new_key=True) as conn:
            if self.engine.dialect.name == "postgresql":  # a held key waits this long at most
                for statement in (*self._set_local, CLAIM_LOCK_TIMEOUT):
                    await conn.exec_driver_sql(statement)
            suspect = await self._suspect(conn, guard, merchant_id, key, body, now)
            if suspect is not None and guard.allow:
                body = _overridden(body)
            claimed = await claim(body)(conn)
            refused = claimed and suspect is not None and not body.allow_duplicate
            if refused:
                await conn.rollback()  # the claim is undone: nothing stored under the key
        return claimed, refused, suspect, body

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
            rrn=self.rrn(merchant_id, key),
            merchant_id=merchant_id,
            terminal_id=body.terminal_id,
            card_token=body.card.token,
            amount=body.amount,
            currency=body.currency,
            type=body.type,
            captured_at=body.captured_at,
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
            rrn=self.rrn(merchant_id, key),
            metadata_json=(
                json.dumps(body.metadata, separators=(",", ":")) if body.metadata else None
            ),
        )

    def finish_work(
        self,
        merchant_id: str,
        key: str,
        body: TransactionCreate,
        auth: Authorization,
        token: int,
        created_at: datetime,
    ) -> Finish:
        """Phase 3 (also the in-doubt settlement, with ``auth`` declined / acquirer_timeout)
        as a work of the batch of finishes (``Finish``): stored response, transaction and
        ledger, or nothing if the lease is gone."""
        txn = self.new_transaction(merchant_id, key, body, auth, created_at=created_at)
        return Finish(self, txn, token, repository.render(txn))

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
        """Phases 2–3 for a key we own (lease ``token``), as work of its own: answered here
        when it ends within ``IDEMPAY_ANSWER_WITHIN``, else 202 — the work goes on (the 0200
        waits for its answer up to ``IDEMPAY_ACQUIRER_TIMEOUT``) and the lookup shows it."""
        answer = acquire.CreateAnswer()
        work = asyncio.ensure_future(
            acquire.authorize_and_finish(
                self,
                merchant_id,
                key,
                body,
                token=token,
                created_at=created_at,
                event=event,
                answer=answer,
            )
        )
        self._background.add(work)
        work.add_done_callback(self._work_done)
        try:
            try:
                return await asyncio.wait_for(
                    asyncio.shield(work), timeout=self.settings.answer_within
                )
            except TimeoutError:
                if answer.releasing:  # the 0200 never left and the claim is being dropped: 503
                    return await work
                answer.answered = True  # from here the key ends terminal on its own
                return self.processing(key, body.terminal_id, event)
        except Exception as exc:
            # The key's claim is durable and its 0200 may have left: a storage error from
            # here on is never "nothing was processed" (503). The key stays processing until
            # its lease runs out and the completer settles it; the lookup tells.
            if not storage_unavailable(exc):
                raise
            log.warning("create_after_claim_storage_error", key=key, error=type(exc).__name__)
            answer.answered = True
            return self.processing(key, body.terminal_id, event)

    def _work_done(self, work: asyncio.Task[Outcome]) -> None:
        self._background.discard(work)
        if not work.cancelled() and (exc := work.exception()) is not None:
            log.warning("create_work_failed", error=type(exc).__name__)

    async def drain(self, timeout_s: float) -> None:
        """At shutdown: let the 0200s in flight end (answered, or settled in doubt)."""
        if self._background:
            await asyncio.wait(set(self._background), timeout=timeout_s)
        await self.claims.close()
        await self.finishes.close()

    async def answer_after_lost_lease(
        self, merchant_id: str, key: str, body: TransactionCreate, event: RequestOutcome
    ) -> Outcome:
        """Someone took the key over while the acquirer answered us: the winner's result
        (its settlement queued the reversal advice that undoes an answer we could not
        record)."""
        epoch = self.cache.epoch
        try:
            record = await self.must_read(merchant_id, key)
        except Exception as exc:  # unreadable now: the key is claimed, never absent
            if not storage_unavailable(exc):
                raise
            return self.processing(key, body.terminal_id, event)
        if record.state == KeyState.PROCESSING:  # settled by its new owner soon: 202
            return self.processing(key, body.terminal_id, event)
        return await self.existing(record, record.fingerprint or "", epoch=epoch)

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
        epoch = self.cache.epoch
        return await self.existing(await self.must_read(merchant_id, key), fingerprint, epoch=epoch)

    # ---------------------------------------------------------- existing keys
    async def existing(self, record: KeyRecord, fingerprint: str, *, epoch: str | None) -> Outcome:
        """Answer from a key that exists: 410 when fenced, 422 for another body, the replay
        when completed, 409 while its lease is live — else recover it now. ``epoch``: the
        cache's epoch taken before ``record`` was read — a replay is cached under it, never
        under an epoch a re-read bound while the read was on its way (contract §3.6)."""
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
            await self.remember(record.merchant_id, record.key, fingerprint, outcome, epoch=epoch)
            return outcome
        now = utcnow()
        if record.lease_live(now):
            return self._in_progress(terminal, lease_until=record.lease_until)
        recovered = await recovery.recover(self, record, now=now)  # its owner vanished
        if recovered.outcome is not None:
            return recovered.outcome
        # Another taker won, or the key was settled past its deadline: the row as it is now.
        epoch = self.cache.epoch
        again = await self.must_read(record.merchant_id, record.key)
        return await self.existing(again, record.fingerprint or "", epoch=epoch)


def _lanes(engine: AsyncEngine, configured: int = 1) -> tuple[int, int]:
    """Batches of each kind in flight at once, and at most while batches stall: one on
    SQLite (one writer at a time anyway); on Postgres ``IDEMPAY_GROUP_COMMIT_LANES`` (default
    1: the fewest commits — measured, 2.2 writes per commit with three lanes and 8.8 with one
    at 50 creates in flight, and 17 % less server CPU per create), up to the engine's whole
    pool while batches stall."""
    if engine.dialect.name != "postgresql":
        return 1, 1
    size = max(1, int(getattr(engine.pool, "size", lambda: 1)()))
    return min(configured, size), size


def _lock_not_available(exc: BaseException) -> bool:
    """SQLSTATE 55P03: a lock wait ran past ``lock_timeout`` (the claim's own, or the
    database's); the statement's transaction was rolled back."""
    orig = getattr(exc, "orig", exc)
    for candidate in (orig, getattr(orig, "__cause__", None)):
        if getattr(candidate, "sqlstate", None) == "55P03":
            return True
    return False


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


class Finish:
    """Phase 3 of one create as a work of a batch of finishes: the key completed by the
    holder of lease ``token`` with the stored response ``text``, then its transaction, ledger
    entry and outbox event (inserts the batch sends together, ``api.deferred``); ``text``, or
    None if the lease is gone. On Postgres (one plain server) a batch of them completes its
    keys in one ``UPDATE`` (``store.complete_together``)."""

    __slots__ = ("service", "txn", "token", "text")

    def __init__(
        self, service: TransactionService, txn: repository.NewTransaction, token: int, text: str
    ) -> None:
        self.service = service
        self.txn = txn
        self.token = token
        self.text = text

    def _completion(self) -> store.Completion:
        return store.Completion(
            merchant_id=self.txn.merchant_id,
            key=self.txn.id,
            token=self.token,
            now=self.txn.processed_at,
            response_status=201,
            response_body=self.text,
        )

    async def _written(self, conn: AsyncConnection) -> str:
        await repository.insert_transaction(conn, self.txn)
        await self.service._announce(conn, self.txn)
        return self.text

    async def __call__(self, conn: AsyncConnection) -> str | None:
        c = self._completion()
        won = await store.complete(
            conn,
            merchant_id=c.merchant_id,
            key=c.key,
            token=c.token,
            now=c.now,
            response_status=c.response_status,
            response_body=c.response_body,
        )
        return await self._written(conn) if won else None

    @classmethod
    def can_go_together(cls, conn: AsyncConnection, works: list[Finish]) -> bool:
        # Citus: a batch is one merchant's, but an UPDATE … FROM unnest(…) is not routed to
        # one shard; there each finish keeps its own UPDATE.
        return conn.dialect.name == "postgresql" and not works[0].service._by_merchant

    @classmethod
    def can_delegate(cls, works: list[Finish]) -> bool:
        return True

    @classmethod
    async def run_delegated(cls, conn: AsyncConnection, works: list[Finish]) -> list[str | None]:
        """Finishes of one merchant as one ``idempay_finish`` call (Citus): each key's
        completion, and the rows each finish writes (collected, unsent: ``api.deferred``),
        which the call inserts for the keys it completed."""
        finishes = []
        deferred.collect(conn)
        try:
            for work in works:
                c = work._completion()
                finishes.append(
                    {
                        "key": c.key,
                        "token": c.token,
                        "status": c.response_status,
                        "body": c.response_body,
                        "at": c.now,
                    }
                )
                await work._written(conn)
        finally:
            rows = deferred.take(conn)
        merchant_id = works[0].txn.merchant_id
        won = set(
            await delegated.call(
                conn,
                delegated.FINISH_CALL,
                merchant_id,
                delegated.dumps(finishes),
                delegated.dumps(rows),
            )
        )
        for n in won:  # the keys settled: this process's waiters wake once the call is back
            store.settled(conn, merchant_id, works[n].txn.id)
        return [work.text if n in won else None for n, work in enumerate(works)]

    @classmethod
    async def run_together(cls, conn: AsyncConnection, works: list[Finish]) -> list[str | None]:
        won = await store.complete_together(conn, [work._completion() for work in works])
        return [
            await work._written(conn) if ours else None
            for work, ours in zip(works, won, strict=True)
        ]
