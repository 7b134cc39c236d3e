"""The one-write create on Postgres: one data-modifying-CTE statement per create.

An asyncpg prepared statement, run on a connection of the hot path's own pool
(``api.db.DriverPool``: three quarters of ``IDEMPAY_DB_POOL_SIZE``, the engine keeps the
rest — one budget; no SQLAlchemy checkout and check-in per request), in autocommit: the
statement is its own transaction, committed with ``synchronous_commit`` on before
``fetchrow`` returns. ``k`` inserts the key row
(``ON CONFLICT DO NOTHING``); every other insert selects ``FROM k`` (or from ``t``), so a
key that exists writes nothing at all, and a concurrent duplicate waits on the unique index
for the first one's commit and then writes nothing (contract §3.2). Any error rolls the whole
statement back (contract §3.1). The same statement returns the existing key row as its snapshot
saw it (never our own insert: a CTE's writes are invisible to the rest of the statement), so
a replay costs one round trip too; a duplicate that committed after the snapshot is not in
it, and the caller reads the row afterwards.

With ``IDEMPAY_PG_GROUP_COMMIT`` (on by default) an unguarded create is not sent alone:
``GroupCommit`` (api/transactions/pg_group.py) queues it and writes the creates queued at one
moment as one statement, ``CREATE_MANY`` (this CTE over arrays), answering each after that
commit; a batch whose statement fails is sent again here, one statement per create.

The key reads of the hot path (replay, lookup, abort, reversal) use the same pool: one
prepared ``SELECT`` in autocommit, no BEGIN/ROLLBACK, no SQLAlchemy.

On Citus (``citus``, probed once at start-up by ``api.main``) ``create`` writes
nothing and answers ``False``: the general path writes instead, every statement routed to
the merchant's shard (docs/scaling.md). ``CREATE`` itself is the same statement on both.

Errors (``pg_group.run``, the one helper both paths share): a pool that cannot give a
connection in ``IDEMPAY_DB_TIMEOUT`` (or open one) and a statement failing for want of storage
(``api.storage_errors.storage_unavailable``) raise ``StorageUnavailableError`` (503, nothing
acknowledged); the connection of the latter is closed and the idle ones retired. Any other
statement error is a bug (500) and leaves the connection usable; a statement cut short
(cancelled) closes its connection. A create past ``command_timeout`` is answered once its
statement has provably ended (201 from its row, or 503 when it wrote nothing), or in doubt
(409) when that cannot be confirmed (``pg_group``, "Timeout"); a read past it is 503.
"""

from __future__ import annotations

from typing import Any

import asyncpg

from api.db import DriverPool, utcnow
from api.idempotency.store import KeyRecord
from api.transactions.guard import DuplicateOf, Guard
from api.transactions.inline import (
    KEY_WIDTH,
    READ_KEY_AND_TRANSACTION,
    TRANSACTION_COLUMNS,
    InlineCreate,
    StorageUnavailableError,
    StoredTransaction,
)
from api.transactions.pg_group import (
    LOCK_WAIT,
    GroupCommit,
    StatementTimedOut,
    after_timeout,
    create_args,
    held_elsewhere,
    run,
)

CREATE = """
WITH lw AS (
  SELECT set_config('lock_timeout', $29, true)
), k AS (
  INSERT INTO idempotency_key (merchant_id, key, state, fingerprint, lease_token,
    terminal_id, response_status, response_body, created_at, updated_at)
  SELECT $1, $2, 'completed', $3, 1, $4, 201, $5, $6, $6 FROM lw
  ON CONFLICT DO NOTHING RETURNING key
), i AS (
  INSERT INTO issuer_authorization (merchant_id, issuer_key, result, decline_reason,
    authorization_code, amount, currency, calls, created_at)
  SELECT $1, $7, $8, $9, $10, $11, $12, 1, $24 FROM k
), t AS (
  INSERT INTO "transaction" (merchant_id, id, terminal_id, type, amount, currency, card_last4,
    card_brand, card_fingerprint, installments, status, decline_reason, authorization_code,
    captured_at, created_at, processed_at, metadata, offline)
  SELECT $1, $2, $4, $13, $11, $12, $14, $15, $16, $17, $8, $9, $10, $18, $6, $19, $20, $28
  FROM k
  RETURNING id
), l AS (
  INSERT INTO ledger_entry (entry_id, merchant_id, transaction_id, amount, currency, kind,
    created_at)
  SELECT $21, $1, t.id, $22, $12, $23, $19 FROM t WHERE $21::varchar IS NOT NULL
), o AS (
  INSERT INTO outbox_event (event_id, merchant_id, type, transaction_id, payload, created_at)
  SELECT $25, $1, $26, t.id, $27, $19 FROM t
)
SELECT (SELECT count(*) FROM k), r.merchant_id, r.key, r.state, r.fingerprint, r.lease_token,
  r.lease_until, r.request, r.response_status, r.response_body, r.terminal_id, r.created_at,
  r.deadline_at
FROM (SELECT 1) AS one
LEFT JOIN idempotency_key AS r ON r.merchant_id = $1 AND r.key = $2
"""

# The same create for a merchant whose duplicate guard is on (api/transactions/guard.py),
# still one statement: ``g`` runs the guard's check first — ``idempay_duplicate_of``
# (migration 0010) takes the guard's advisory lock, then probes with a fresh snapshot, so a
# racing create of the same sale is committed and seen, or waits for us — and ``k`` inserts
# the key only when the check found nothing or the cashier allowed it ($32); ``t`` records
# the override; the last column is the suspect's id. A key that exists still answers from
# ``r`` (a replay is never refused). $29/$30: the window's bounds; $31: the lock; $33: the
# lock wait bound (``lw``, as in ``CREATE``).
CREATE_GUARDED = """
WITH lw AS (
  SELECT set_config('lock_timeout', $33, true)
), g AS (
  SELECT idempay_duplicate_of($1, $4, $16, $11, $12, $29, $30, $2, $31) AS id FROM lw
), k AS (
  INSERT INTO idempotency_key (merchant_id, key, state, fingerprint, lease_token,
    terminal_id, response_status, response_body, created_at, updated_at)
  SELECT $1, $2, 'completed', $3, 1, $4, 201, $5, $6, $6 FROM g WHERE g.id IS NULL OR $32
  ON CONFLICT DO NOTHING RETURNING key
), i AS (
  INSERT INTO issuer_authorization (merchant_id, issuer_key, result, decline_reason,
    authorization_code, amount, currency, calls, created_at)
  SELECT $1, $7, $8, $9, $10, $11, $12, 1, $24 FROM k
), t AS (
  INSERT INTO "transaction" (merchant_id, id, terminal_id, type, amount, currency, card_last4,
    card_brand, card_fingerprint, installments, status, decline_reason, authorization_code,
    captured_at, created_at, processed_at, metadata, offline, duplicate_override)
  SELECT $1, $2, $4, $13, $11, $12, $14, $15, $16, $17, $8, $9, $10, $18, $6, $19, $20, $28,
    g.id IS NOT NULL
  FROM k CROSS JOIN g
  RETURNING id
), l AS (
  INSERT INTO ledger_entry (entry_id, merchant_id, transaction_id, amount, currency, kind,
    created_at)
  SELECT $21, $1, t.id, $22, $12, $23, $19 FROM t WHERE $21::varchar IS NOT NULL
), o AS (
  INSERT INTO outbox_event (event_id, merchant_id, type, transaction_id, payload, created_at)
  SELECT $25, $1, $26, t.id, $27, $19 FROM t
)
SELECT (SELECT count(*) FROM k), r.merchant_id, r.key, r.state, r.fingerprint, r.lease_token,
  r.lease_until, r.request, r.response_status, r.response_body, r.terminal_id, r.created_at,
  r.deadline_at, (SELECT id FROM g)
FROM (SELECT 1) AS one
LEFT JOIN idempotency_key AS r ON r.merchant_id = $1 AND r.key = $2
"""

READ_KEY = """
SELECT merchant_id, key, state, fingerprint, lease_token, lease_until, request,
  response_status, response_body, terminal_id, created_at, deadline_at
FROM idempotency_key WHERE merchant_id = $1 AND key = $2
"""

READ_WITH_TRANSACTION = READ_KEY_AND_TRANSACTION.format(merchant="$1", key="$2")

READ_TRANSACTION = (
    f'SELECT {TRANSACTION_COLUMNS} FROM "transaction" WHERE merchant_id = $1 AND id = $2'
)


class PgInline:
    """``citus``: the database has Citus (the app's start-up probe, ``api.main``). Citus plans
    each INSERT of ``CREATE``'s CTE as a step of its own and ships the steps' results to every
    worker (one worker down would fail every merchant's create), so there ``create`` writes
    nothing and the general path writes instead: one transaction of statements, each routed
    to the merchant's shard."""

    def __init__(self, pool: DriverPool, *, citus: bool, group_commit: bool = False) -> None:
        self.pool = pool
        self.citus = citus
        # ``lock_timeout`` of a create's own statement (``pg_group.LOCK_WAIT``): past it, a
        # key another transaction holds is answered 409 (``held_elsewhere``).
        self.lock_wait = LOCK_WAIT
        # ``IDEMPAY_PG_GROUP_COMMIT``: unguarded creates queued and written many to a
        # statement (api/transactions/pg_group.py); a failed batch falls back to this path.
        self.group = (
            GroupCommit(pool, PgInline(pool, citus=False).create)
            if group_commit and not citus
            else None
        )

    async def _call(self, method: str, statement: str, *args: Any) -> Any:
        """One statement (``pg_group.run``). Past ``command_timeout`` it raises
        ``StatementTimedOut`` (a 503 as it is: right for a read, which processed nothing;
        ``create`` answers it from what the statement left)."""
        return await run(self.pool, method, statement, *args)

    async def create(
        self, rows: InlineCreate, guard: Guard | None = None
    ) -> KeyRecord | bool | DuplicateOf:
        if self.citus:
            return False  # nothing written: the general path answers (one shard per statement)
        if guard is None and self.group is not None:
            return await self.group.create(rows)  # many creates per statement (pg_group)
        txn = rows.txn
        args: tuple[Any, ...]
        args = create_args(rows, utcnow())
        statement, args = CREATE, (*args, self.lock_wait)
        if guard is not None:  # the duplicate guard's check, inside the same statement
            since, until = guard.bounds(txn.created_at)
            statement = CREATE_GUARDED
            args = (*args[:-1], since, until, guard.lock, guard.allow, self.lock_wait)
        try:
            row = await self._call("fetchrow", statement, *args)
        except asyncpg.UniqueViolationError:
            # Not the key (its conflict writes nothing): an issuer record left by a purged
            # tombstone's void. The general path answers from the simulator's record.
            return False
        except asyncpg.LockNotAvailableError:
            # Past ``LOCK_WAIT`` on a lock another transaction holds — its uncommitted row of
            # this key (a stuck writer, an operator's open transaction), or the guard's lock
            # of this sale: rolled back, nothing written. The key is being processed
            # elsewhere: 409 ``request_in_progress`` with ``Retry-After`` (a retry replays
            # what the holder commits, or writes if it rolls back), instead of holding one
            # of the hot path's connections until ``command_timeout`` — a handful of such
            # keys held every connection and answered unrelated creates 503 (review s7).
            # A committed key row being updated by another transaction (an operator's UPDATE,
            # a backfill) blocks the insert's conflict check too, yet its answer is readable
            # without waiting: a replay, a fence — not an in-flight 409 (review s7).
            existing = await self.read(txn.merchant_id, txn.id)
            if existing is not None:
                return existing
            if guard is not None:
                # The lock may be the guard's lock of this sale, held by ANOTHER key's create
                # (stalled): nobody processes this key, and its lookup says 404 — so not
                # "this key is being processed" (409) but the 503 that matches the lookup:
                # nothing was processed, retry with the same key (review s7b).
                raise StorageUnavailableError("lock wait: the guard is held") from None
            return held_elsewhere(rows)
        except StatementTimedOut as exc:  # ended or in doubt: answered from its key, or 409
            (answer,) = await after_timeout(self.pool, [rows], ended=exc.ended)
            if isinstance(answer, StorageUnavailableError):
                raise answer from exc  # the statement is over and wrote nothing: 503 is true
            return answer
        if row[0]:
            return True
        if guard is None:
            return KeyRecord(*row[1:]) if row[1] is not None else False
        if row[1] is not None:  # the key exists: its own answer, never the guard's
            return KeyRecord(*row[1:-1])
        suspect = row[-1]
        if suspect is None or guard.allow:
            return False
        # The statement's snapshot predates its wait on the guard's lock: an earlier attempt
        # of this key that committed meanwhile is not in ``r``. A key that exists is never
        # refused (its stored answer wins): read it before answering the guard's 409.
        existing = await self.read(txn.merchant_id, txn.id)
        return existing if existing is not None else DuplicateOf(suspect)

    async def read(self, merchant_id: str, key: str) -> KeyRecord | None:
        row = await self._call("fetchrow", READ_KEY, merchant_id, key)
        return KeyRecord(*row) if row is not None else None

    async def read_transaction(self, merchant_id: str, key: str) -> StoredTransaction | None:
        row = await self._call("fetchrow", READ_TRANSACTION, merchant_id, key)
        return StoredTransaction(*row) if row is not None else None

    async def read_with_transaction(
        self, merchant_id: str, key: str
    ) -> tuple[KeyRecord | None, StoredTransaction | None]:
        row = await self._call("fetchrow", READ_WITH_TRANSACTION, merchant_id, key)
        if row is None:
            return None, None
        record = KeyRecord(*row[:KEY_WIDTH])
        txn = StoredTransaction(*row[KEY_WIDTH:]) if row[KEY_WIDTH] is not None else None
        return record, txn

    def answer_in_flight(self) -> None:
        """The worker is about to be stopped (SIGTERM, near the end of its grace): every
        queued or batched create still unanswered is answered now (``GroupCommit``) — the
        alternative is uvicorn's bare 500 when the grace ends."""
        if self.group is not None:
            self.group.answer_in_flight()

    async def close(self) -> None:
        """Finish the queued creates, then close the pool's connections (the app's
        shutdown, after the last request)."""
        if self.group is not None:
            await self.group.close()
        await self.pool.close()
