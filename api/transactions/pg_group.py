"""Postgres group commit for the one-write create: many creates, one statement, one commit.

``PgInline.create`` (api/transactions/pg_create.py) hands an unguarded create on plain
Postgres to ``GroupCommit`` (``IDEMPAY_PG_GROUP_COMMIT``, on by default): the create is
queued, and each of ``writers`` writer tasks, whenever it is free, takes everything queued
(at most ``cap``; no timer) and sends it as ONE statement, ``CREATE_MANY`` — ``CREATE``'s
CTE over ``unnest`` arrays — on a connection of the hot path's pool, in autocommit with
``synchronous_commit`` on. Each create is answered from its row of the result only after
that statement (its commit) returned: nothing is acknowledged before its commit is durable
(contract §3.1). Measured (docs/benchmarks.md, "Group commit on Postgres"): one commit and
WAL flush for a batch instead of one per create. Guarded creates (``CREATE_GUARDED``) and
Citus keep one statement per create.

Per create the answers are ``CREATE``'s: True (written), its key row (nothing written: the
key exists, as the statement's snapshot saw it), or False (nothing written: a duplicate
committed after the snapshot; the caller reads the key).

- **Keys.** The key rows are inserted in (merchant, key) order, ``ON CONFLICT DO NOTHING``:
  two batches sharing keys wait for each other in one order instead of deadlocking. A key
  that exists writes nothing (every other insert selects from the inserted keys). A key
  already in the batch being taken, or in a batch in flight, waits in the queue for the
  next batch after that one's commit: it then finds the first one's row (a replay, or
  409/410/422 by the usual rules of ``TransactionService.existing``) instead of parking
  a batch on the first one's uncommitted row.
- **A statement error** (not storage: a constraint, a deadlock, a serialization failure,
  the lock wait below) rolled the whole statement back — nothing of the batch is written —
  and each of its creates is sent again on its own (``single``: today's one statement per
  create, in a task of its own, so the writer goes on to the next batch), so one bad or
  stuck create fails or waits alone.
- **Storage** (``api.storage_errors.storage_unavailable``, no connection in
  ``IDEMPAY_DB_TIMEOUT``): every create of the batch gets ``StorageUnavailableError`` (503,
  nothing acknowledged) — also when the commit's outcome is unknown (a connection lost
  mid-statement): a retry with the same key replays or writes, never twice.
- **Timeout** (asyncpg's ``command_timeout``, batch or one create: ``run``). The answer
  waits until the statement has ended in Postgres: the connection is kept until the server
  acknowledges asyncpg's cancel (its ReadyForQuery) — closing it at once, as before, dropped
  the cancel unsent and Postgres committed the statement seconds after a 503. Then
  ``after_timeout`` reads the keys: a create whose own row is there is True (201, written),
  another's row is that row, no row is 503 (true now: the statement is over). When the end
  cannot be confirmed within the pool's ``timeout`` (the database unreachable), a create
  with no row — or every create, if the read fails — is answered in doubt (``in_doubt``:
  409 ``request_in_progress``, look up after ``Retry-After``), never 503 — contract §2.2.
  Measured on Postgres 15: a ``set_config('statement_timeout', …)`` inside the statement
  does not arm the timer for that statement; a startup ``statement_timeout`` is an unknown
  startup parameter to PgBouncer in transaction mode (docs/operations.md; not measured
  here): so the protocol's cancel, which PgBouncer routes to the server connection, is the
  bound.
- **Head of line.** A key waiting on another transaction's uncommitted insert of it stalls
  its batch until that commits; ``writers`` (2 by default, never more than the pool's
  connections) lets the next batch go meanwhile, and past ``lock_wait`` (500 ms) the batch
  gives up (``lock_timeout``, a statement error): one statement per create, so only the
  contended key waits on — at most ``LOCK_WAIT`` again, then it is answered 409
  ``request_in_progress`` (``held_elsewhere``): nothing of it was written, another
  transaction holds its key.
- **Cancellation.** The statement runs in the writer task, never in a caller's: a caller
  cancelled (a client gone) drops only its own answer. A create whose caller gave up before
  its batch was taken is not sent.
- **Shutdown.** ``close`` lets the writers finish everything queued, then ends them (the
  lifespan closes ``PgInline`` after the last request, before the pool).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from api.db import DriverPool, utcnow
from api.idempotency.store import PROCESSING, KeyRecord
from api.storage_errors import storage_unavailable
from api.transactions.guard import DuplicateOf
from api.transactions.inline import InlineCreate, StorageUnavailableError

# pg_create.CREATE over arrays: $n is the array of CREATE's $n, one element per create (the
# same 28 values in the same order, ``create_args``). ``k`` inserts the key rows sorted by
# (merchant, key) — every batch takes the keys' unique-index entries in one order, so two
# batches sharing keys wait for each other instead of deadlocking; ``w`` is the rows whose key
# was inserted; the other inserts select from it, so a key that exists writes nothing. The
# result has one row per create (``ord``: its place in the arrays): inserted or not, and the
# key row as the statement's snapshot saw it (never our own insert), like CREATE's. ``lw``
# ($29, evaluated before the first key is inserted) bounds this statement's lock waits
# (``lock_timeout``, for this statement's transaction only): ``GroupCommit.lock_wait``.
CREATE_MANY = """
WITH u AS (
  SELECT * FROM unnest($1::varchar[], $2::varchar[], $3::varchar[], $4::varchar[], $5::text[],
    $6::timestamptz[], $7::varchar[], $8::varchar[], $9::varchar[], $10::varchar[],
    $11::bigint[], $12::varchar[], $13::varchar[], $14::varchar[], $15::varchar[],
    $16::varchar[], $17::int[], $18::timestamptz[], $19::timestamptz[], $20::text[],
    $21::varchar[], $22::bigint[], $23::varchar[], $24::timestamptz[], $25::varchar[],
    $26::varchar[], $27::text[], $28::boolean[])
  WITH ORDINALITY AS u(merchant_id, key, fingerprint, terminal_id, response_body, created_at,
    issuer_key, status, decline_reason, authorization_code, amount, currency, type,
    card_last4, card_brand, card_fingerprint, installments, captured_at, processed_at,
    metadata, entry_id, ledger_amount, kind, issued_at, event_id, event_type, payload,
    offline, ord)
), lw AS (
  SELECT set_config('lock_timeout', $29, true)
), k AS (
  INSERT INTO idempotency_key (merchant_id, key, state, fingerprint, lease_token,
    terminal_id, response_status, response_body, created_at, updated_at)
  SELECT merchant_id, key, 'completed', fingerprint, 1, terminal_id, 201, response_body,
    created_at, created_at
  FROM u CROSS JOIN lw ORDER BY merchant_id, key
  ON CONFLICT DO NOTHING RETURNING merchant_id, key
), w AS (
  SELECT u.* FROM u JOIN k ON k.merchant_id = u.merchant_id AND k.key = u.key
), i AS (
  INSERT INTO issuer_authorization (merchant_id, issuer_key, result, decline_reason,
    authorization_code, amount, currency, calls, created_at)
  SELECT merchant_id, issuer_key, status, decline_reason, authorization_code, amount,
    currency, 1, issued_at FROM w
), t AS (
  INSERT INTO "transaction" (merchant_id, id, terminal_id, type, amount, currency, card_last4,
    card_brand, card_fingerprint, installments, status, decline_reason, authorization_code,
    captured_at, created_at, processed_at, metadata, offline)
  SELECT merchant_id, key, terminal_id, type, amount, currency, card_last4, card_brand,
    card_fingerprint, installments, status, decline_reason, authorization_code, captured_at,
    created_at, processed_at, metadata, offline
  FROM w
  RETURNING merchant_id, id
), l AS (
  INSERT INTO ledger_entry (entry_id, merchant_id, transaction_id, amount, currency, kind,
    created_at)
  SELECT w.entry_id, w.merchant_id, t.id, w.ledger_amount, w.currency, w.kind, w.processed_at
  FROM w JOIN t ON t.merchant_id = w.merchant_id AND t.id = w.key
  WHERE w.entry_id IS NOT NULL
), o AS (
  INSERT INTO outbox_event (event_id, merchant_id, type, transaction_id, payload, created_at)
  SELECT w.event_id, w.merchant_id, w.event_type, t.id, w.payload, w.processed_at
  FROM w JOIN t ON t.merchant_id = w.merchant_id AND t.id = w.key
)
SELECT u.ord, k.key IS NOT NULL, r.merchant_id, r.key, r.state, r.fingerprint, r.lease_token,
  r.lease_until, r.request, r.response_status, r.response_body, r.terminal_id, r.created_at,
  r.deadline_at
FROM u
LEFT JOIN k ON k.merchant_id = u.merchant_id AND k.key = u.key
LEFT JOIN idempotency_key AS r ON r.merchant_id = u.merchant_id AND r.key = u.key
"""

# Batches in flight at once: 2, so a batch parked on another transaction's row does not stop
# the next. Measured through HTTP (loadtest.bench_ab, create, 6 rounds x 5 s, 50 in flight,
# paired against one statement per create): 1, 2, 4 writers x1.33 / x1.53 / x1.32 creates/s,
# Postgres CPU per create x0.44 / x0.45 / x0.60 (4: smaller batches, more commits).
WRITERS = 2
CAP = 64  # creates per statement at most
# How long a batch waits on another transaction's row of one of its keys before giving up
# (SQLSTATE 55P03, a statement error: rolled back whole, then one statement per create — the
# other creates are written at once and only that key waits, as it would alone). Batches of
# other workers sharing a key commit in milliseconds; a longer wait is a stuck transaction,
# which would otherwise hold up to ``CAP`` unrelated creates until ``command_timeout`` (503).
LOCK_WAIT = "500ms"
# A create sent alone (``PgInline.create``: its batch failed, or no group commit) waits on a
# holder of its key at most ``LOCK_WAIT`` too, then answers 409 ``request_in_progress``
# (``held_elsewhere``): a stuck holder never keeps a hot-path connection longer, so a handful
# of held keys cannot take every connection from unrelated creates (review s7), and no create
# still waits on a lock when SIGTERM's grace ends. The in-flight answer's lease: a retry
# after it finds the holder's outcome.
HELD_RETRY_S = 1.0

Answer = KeyRecord | bool
Single = Callable[[InlineCreate], Awaitable[KeyRecord | bool | DuplicateOf]]

# The key rows of a timed-out statement's creates, read after it (``after_timeout``).
READ_KEYS = """
SELECT r.merchant_id, r.key, r.state, r.fingerprint, r.lease_token, r.lease_until, r.request,
  r.response_status, r.response_body, r.terminal_id, r.created_at, r.deadline_at
FROM unnest($1::varchar[], $2::varchar[]) AS u(merchant_id, key)
JOIN idempotency_key AS r ON r.merchant_id = u.merchant_id AND r.key = u.key
"""


class StatementTimedOut(StorageUnavailableError):
    """The statement ran past the connection's ``command_timeout``. ``ended``: asyncpg's
    cancel was acknowledged by the server (its ReadyForQuery), so the statement's transaction
    is over — committed or rolled back, read to know; else its end could not be confirmed
    (no acknowledgement within the pool's ``timeout``, the connection lost): it may still
    commit. A read answers it 503 (a read processes nothing); a create must not: its answer
    comes from what the statement left (``after_timeout``)."""

    def __init__(self, *, ended: bool) -> None:
        super().__init__("statement timed out" + ("; ended" if ended else "; outcome unknown"))
        self.ended = ended


async def run(pool: DriverPool, method: str, statement: str, *args: Any) -> Any:
    """One statement on a connection of ``pool`` (``conn.<method>``, autocommit): the one
    place the hot path takes, gives back and closes connections. No connection in the pool's
    ``timeout`` (or none can be opened), or a statement failing for want of storage: raises
    ``StorageUnavailableError`` (503; the statement never ran or the server rolled it back)
    and closes the connection. Another statement error (a bug, a constraint, a lock wait) is
    raised as it is and the connection goes back. Past ``command_timeout``: raises
    ``StatementTimedOut`` only once the statement has provably ended in Postgres, or with
    ``ended=False`` when that could not be confirmed — never while it may still commit
    unnoticed: closing the connection at once (as before) dropped asyncpg's cancel before it
    was sent, and Postgres ran the statement to its commit seconds after a 503."""
    try:
        conn = await pool.acquire()
    except Exception as exc:  # no connection in time, connect refused, pool closed
        raise StorageUnavailableError(type(exc).__name__) from exc
    try:
        result = await getattr(conn, method)(statement, *args)
    except TimeoutError:  # command_timeout: asyncpg has only scheduled the server's cancel
        ended = await _settle(pool, conn)
        raise StatementTimedOut(ended=ended) from None
    except Exception as exc:
        if not storage_unavailable(exc):
            pool.release(conn)  # a statement error: rolled back, the connection is fine
            raise
        pool.discard(conn, outage=True)  # never hand a broken connection out again
        raise StorageUnavailableError(type(exc).__name__) from exc
    except BaseException:
        pool.discard(conn, outage=False)  # cut short mid-statement: not reusable
        raise
    pool.release(conn)  # autocommit: committed (durable) when the call returned
    return result


async def _settle(pool: DriverPool, conn: Any) -> bool:
    """After a ``command_timeout``: True once the server has ended the statement. asyncpg
    runs the next query on this connection only after its cancel was sent and the server
    answered the cancelled statement (ReadyForQuery: its transaction committed or rolled
    back, nothing of it left running); it closes the connection itself if that does not
    come within the timeout. Meant to hold behind PgBouncer too (not measured here): the
    cancel is the protocol's, which PgBouncer routes to the server connection running the
    statement, and no backend pid is used."""
    try:
        await conn.fetchval("SELECT 1", timeout=pool.timeout)
    except Exception:  # unconfirmed (asyncpg closed it): the statement may still commit
        pool.discard(conn, outage=True)
        return False
    except BaseException:  # cancelled while waiting
        pool.discard(conn, outage=False)
        raise
    pool.release(conn)
    return True


def held_elsewhere(rows: InlineCreate) -> KeyRecord:
    """The answer for a create whose own statement gave up waiting on a lock another
    transaction holds (``lock_timeout``, ``LOCK_WAIT``; rolled back, nothing written): its
    key as in flight — 409 ``request_in_progress``, ``Retry-After`` (contract §2.2)."""
    return in_doubt(rows, HELD_RETRY_S)


def in_doubt(rows: InlineCreate, seconds: float) -> KeyRecord:
    """The answer for a create whose statement may still commit: its key as in flight
    (``processing``, this create's fingerprint, a lease of ``seconds``) — answered 409
    ``request_in_progress`` with ``Retry-After`` (contract §2.2), the in-flight answer the
    contract has, never 503 ("nothing was processed"). Nothing of it is stored."""
    txn = rows.txn
    until = utcnow() + timedelta(seconds=seconds)
    return KeyRecord(
        txn.merchant_id, txn.id, PROCESSING, rows.fingerprint, 0, until, None, None, None,
        txn.terminal_id, txn.created_at, None,
    )  # fmt: skip


async def after_timeout(
    pool: DriverPool, creates: Sequence[InlineCreate], *, ended: bool
) -> list[Answer | StorageUnavailableError]:
    """Each create's answer after its statement timed out (``StatementTimedOut``): its key is
    read. A row this create wrote (its own response body) is True — 201, as written: the
    statement committed. Another's row is that row (answered by the usual rules; the
    statement writes nothing for an existing key). No row: ``StorageUnavailableError`` (503,
    true now) when the statement has ended (``ended``), else ``in_doubt`` — it may still
    commit. The read failing (storage down): ``in_doubt`` for every create."""
    merchants = [create.txn.merchant_id for create in creates]
    keys = [create.txn.id for create in creates]
    try:
        found = await run(pool, "fetch", READ_KEYS, merchants, keys)
    except Exception:  # storage down after all: whether it committed is unknown
        return [in_doubt(create, pool.timeout) for create in creates]
    stored = {(row[0], row[1]): KeyRecord(*row) for row in found}
    out: list[Answer | StorageUnavailableError] = []
    for create in creates:
        record = stored.get((create.txn.merchant_id, create.txn.id))
        if record is None:
            out.append(
                StorageUnavailableError("statement timed out and was cancelled")
                if ended
                else in_doubt(create, pool.timeout)
            )
        elif (record.fingerprint, record.response_body) == (
            create.fingerprint,
            create.response_body,
        ):
            out.append(True)  # this create's own row: its statement committed
        else:
            out.append(record)
    return out


def create_args(rows: InlineCreate, issued_at: datetime) -> tuple[Any, ...]:
    """``CREATE``'s 28 arguments (``pg_create``), one create's element of ``CREATE_MANY``'s
    arrays: the same values in the same order for both statements."""
    txn, ledger, event = rows.txn, rows.ledger or {}, rows.event
    return (
        txn.merchant_id, txn.id, rows.fingerprint, txn.terminal_id, rows.response_body,
        txn.created_at, rows.issuer_key, txn.status, txn.decline_reason,
        txn.authorization_code, txn.amount, txn.currency, txn.type, txn.card_last4,
        txn.card_brand, txn.card_fingerprint, txn.installments, txn.captured_at,
        txn.processed_at, txn.metadata_json, ledger.get("entry_id"),
        ledger.get("amount"), ledger.get("kind"), issued_at, event["event_id"],
        event["type"], event["payload"], txn.offline,
    )  # fmt: skip


def columns(args: Sequence[tuple[Any, ...]]) -> list[list[Any]]:
    """One list per parameter of ``CREATE_MANY`` (the creates' arguments transposed)."""
    return [list(column) for column in zip(*args, strict=True)]


def answers(rows: Sequence[Any], size: int) -> list[Answer]:
    """Each create's answer, in the arrays' order: True (written), its key row (nothing
    written, the key exists), or False (nothing written, the key was committed after the
    statement's snapshot: the caller reads it)."""
    out: list[Answer] = [False] * size
    for row in rows:
        if row[1]:
            out[row[0] - 1] = True
        elif row[2] is not None:
            out[row[0] - 1] = KeyRecord(*row[2:])
    return out


class _Queued:
    __slots__ = ("ident", "args", "rows", "future", "alone")

    def __init__(self, rows: InlineCreate, future: asyncio.Future[Answer]) -> None:
        self.ident = (rows.txn.merchant_id, rows.txn.id)
        self.args = create_args(rows, utcnow())
        self.rows = rows
        self.future = future
        self.alone = False  # sent again on its own (its batch failed): it holds its key


class GroupCommit:
    """The queue and its writers (module docstring). ``single``: one create in one statement
    (``PgInline.create`` without group commit), for a batch whose statement failed and for a
    create arriving after ``close`` began. ``batches``/``sent``/``fallbacks``: counters."""

    def __init__(
        self, pool: DriverPool, single: Single, *, writers: int = WRITERS, cap: int = CAP
    ) -> None:
        self.pool = pool
        self.single = single
        self.writers = max(1, min(writers, pool.size))
        self.cap = cap
        self.lock_wait = LOCK_WAIT  # Postgres ``lock_timeout`` text for each batch statement
        self.batches = 0  # statements sent
        self.sent = 0  # creates sent in them
        self.fallbacks = 0  # batches whose statement failed: sent again one by one
        self._pending: deque[_Queued] = deque()
        self._in_flight: set[tuple[str, str]] = set()  # keys of the batches being written
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._alone: set[asyncio.Task[None]] = set()  # a failed batch's creates, one each
        self._sending: set[_Queued] = set()  # creates whose statement runs now
        self._closing = False

    async def create(self, rows: InlineCreate) -> Answer:
        if self._closing:  # shutting down: the one statement (a closed pool answers 503)
            return await self._one(rows)
        if len(self._tasks) < self.writers:  # the first create (a writer ended restarts)
            self._start_writers()
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._pending.append(_Queued(rows, future))
        self._wake.set()
        # Awaited bare: cancelling the caller cancels this future only, never the batch
        # (the writer answers a cancelled future no more).
        return await future

    def _start_writers(self) -> None:
        """On the first create (in the serving loop): ``writers`` writer tasks. A writer that
        ends before ``close`` (only a cancelled one does) is replaced from its done-callback
        (``_ended``), so the queue never lacks its writers and ``create`` checks nothing."""
        while len(self._tasks) < self.writers:
            task = asyncio.create_task(self._writer(), name="pg-group-commit")
            task.add_done_callback(self._ended)
            self._tasks.append(task)

    def _ended(self, task: asyncio.Task[None]) -> None:
        if task in self._tasks:
            self._tasks.remove(task)
        if not self._closing and not task.get_loop().is_closed():
            self._start_writers()

    async def close(self) -> None:
        """Finish every create queued (the writers take batches until the queue is empty),
        then end the writers. Anything left unanswered (``close`` itself cancelled) is 503."""
        self._closing = True
        self._wake.set()
        try:
            await asyncio.gather(*self._tasks)
            while self._alone:
                await asyncio.gather(*self._alone)
        finally:
            for task in (*self._tasks, *self._alone):
                task.cancel()
            while self._pending:
                _fail(self._pending.popleft(), "closed")

    def answer_in_flight(self) -> None:
        """SIGTERM's grace is ending (``api.main``): a create whose statement still runs (a
        stalled commit: a synchronous standby, an I/O stall) is answered in flight —
        ``in_doubt``, 409 ``request_in_progress`` with ``Retry-After``: it may still commit,
        and the terminal's lookup finds out — instead of the bare text/plain 500 uvicorn
        answers when the grace ends. A queued create not sent yet is answered 503 and never
        sent (``_take`` skips answered ones): nothing of it was or will be written. The
        statements themselves are left to finish (``close`` waits for them)."""
        for item in list(self._sending):
            if not item.future.done():
                item.future.set_result(in_doubt(item.rows, HELD_RETRY_S))
        for item in self._pending:
            _fail(item, "shutting down")

    def _take(self) -> list[_Queued]:
        batch: list[_Queued] = []
        later: list[_Queued] = []
        pending, in_flight = self._pending, self._in_flight
        while pending and len(batch) < self.cap:
            item = pending.popleft()
            if item.future.done():
                continue  # its caller gave up before it was sent: nothing written, no answer
            if item.ident in in_flight:
                later.append(item)  # the same key: the next batch, after this one's commit
                continue
            in_flight.add(item.ident)
            batch.append(item)
        pending.extendleft(reversed(later))
        return batch

    async def _writer(self) -> None:
        wake = self._wake
        while True:
            batch = self._take()
            if batch:
                try:
                    await self._write(batch)
                finally:
                    self._in_flight.difference_update(
                        item.ident for item in batch if not item.alone
                    )
                    wake.set()  # a key held back for this batch may go now
                continue
            if self._closing and not self._pending:
                return
            wake.clear()  # no await since _take: nothing queued in between is missed
            await wake.wait()

    async def _write(self, batch: list[_Queued]) -> None:
        """Send the batch; answer every create of it, whatever happens."""
        self._sending.update(batch)
        try:
            await self._send(batch)
        except Exception as exc:  # a bug: each create fails with it (500), the writer lives
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(exc)
        except BaseException:  # the writer cancelled: the outcome is unknown, retry-safe
            for item in batch:
                _fail(item, "cancelled")
            raise
        finally:
            self._sending.difference_update(item for item in batch if not item.alone)

    async def _send(self, batch: list[_Queued]) -> None:
        self.batches += 1
        self.sent += len(batch)
        try:
            rows = await run(
                self.pool, "fetch", CREATE_MANY, *columns([item.args for item in batch]),
                self.lock_wait,
            )  # fmt: skip
        except StatementTimedOut as exc:  # ended, or may still commit: never a plain 503
            creates = [item.rows for item in batch]
            settled = await after_timeout(self.pool, creates, ended=exc.ended)
            for item, answer in zip(batch, settled, strict=True):
                if item.future.done():
                    continue
                if isinstance(answer, StorageUnavailableError):
                    item.future.set_exception(answer)
                else:
                    item.future.set_result(answer)
            return
        except StorageUnavailableError as exc:  # never ran, or the server rolled it back
            for item in batch:
                _fail(item, str(exc))
            return
        except Exception:  # the whole statement rolled back: one statement per create
            self.fallbacks += 1
            # Not awaited here: a create whose own statement waits (a stuck holder of its
            # key) must not keep this writer from the next batch. Each holds its key until
            # answered; ``close`` waits for them.
            for item in batch:
                item.alone = True
                task = asyncio.create_task(self._answer_one(item))
                self._alone.add(task)
                task.add_done_callback(self._alone.discard)
            return
        # autocommit: committed (durable) when the statement returned
        for item, answer in zip(batch, answers(rows, len(batch)), strict=True):
            if not item.future.done():
                item.future.set_result(answer)

    async def _one(self, rows: InlineCreate) -> Answer:
        result = await self.single(rows)
        if isinstance(result, DuplicateOf):  # pragma: no cover - no guard, no DuplicateOf
            raise AssertionError("an unguarded create answered DuplicateOf")
        return result

    async def _answer_one(self, item: _Queued) -> None:
        try:
            if item.future.done():
                return  # its caller is gone: not sent again
            try:
                result = await self._one(item.rows)
            except Exception as exc:
                if not item.future.done():
                    item.future.set_exception(exc)
                return
            except BaseException:  # cancelled (a cancelled close): outcome unknown, 503
                _fail(item, "cancelled")
                raise
            if not item.future.done():
                item.future.set_result(result)
        finally:
            self._sending.discard(item)
            self._in_flight.discard(item.ident)
            self._wake.set()  # a later attempt of this key may go now


def _fail(item: _Queued, why: str) -> None:
    if not item.future.done():  # one exception per create: each caller raises its own
        item.future.set_exception(StorageUnavailableError(why))
