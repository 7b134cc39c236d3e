"""The one-write create on the embedded SQLite: one writer thread with group commit.

Requests put their rows on a queue; one thread with its own ``sqlite3`` connection (WAL,
``synchronous=FULL``, as ``api/db.py`` sets up) takes everything queued (up to
``MAX_BATCH``), runs ``BEGIN IMMEDIATE``, each create inside its own SAVEPOINT (the key
insert decides; a failing statement rolls back that create only), one ``COMMIT`` — one
fsync for the batch — and only then answers the batch. No answer before its commit is
durable; a failed BEGIN or COMMIT answers the whole batch with the error (nothing of it was
acknowledged, nothing of it stays).

Key reads go to a second thread with a read-only connection (``query_only``, autocommit):
under WAL a reader sees the last commit and takes no lock, so replays and lookups no longer
queue behind writers for ``BEGIN IMMEDIATE``. Request events' flushes (``write_events``) ride
the writer's batches too, each in a savepoint of its own: one fsync for creates and events,
instead of a flush holding the write lock for its own commit while creates wait. Other
writers (claims, aborts, reversals, the completer) keep their ``BEGIN IMMEDIATE`` on
SQLAlchemy's connections and queue with this thread on the database lock (``busy_timeout``).
"""

from __future__ import annotations

import asyncio
import queue
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

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

MAX_BATCH = 256
_KEY = (
    "INSERT INTO idempotency_key (merchant_id, key, state, fingerprint, lease_token, terminal_id,"
    " response_status, response_body, created_at, updated_at)"
    " VALUES (?, ?, 'completed', ?, 1, ?, 201, ?, ?, ?) ON CONFLICT DO NOTHING"
)
_ISSUER = (
    "INSERT INTO issuer_authorization (merchant_id, issuer_key, result, decline_reason,"
    " authorization_code, amount, currency, calls, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, 1, ?)"
)
_TXN = (
    'INSERT INTO "transaction" (merchant_id, id, terminal_id, type, amount, currency, card_last4,'
    " card_brand, card_fingerprint, installments, status, decline_reason, authorization_code,"
    " captured_at, created_at, processed_at, metadata, offline)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_LEDGER = (
    "INSERT INTO ledger_entry (entry_id, merchant_id, transaction_id, amount, currency, kind,"
    " created_at) VALUES (?, ?, ?, ?, ?, ?, ?)"
)
_OUTBOX = (
    "INSERT INTO outbox_event (event_id, merchant_id, type, transaction_id, payload, created_at)"
    " VALUES (?, ?, ?, ?, ?, ?)"
)
_READ_KEY = (
    "SELECT merchant_id, key, state, fingerprint, lease_token, lease_until, request,"
    " response_status, response_body, terminal_id, created_at, deadline_at"
    " FROM idempotency_key WHERE merchant_id = ? AND key = ?"
)
_READ_TRANSACTION = (
    f'SELECT {TRANSACTION_COLUMNS} FROM "transaction" WHERE merchant_id = ? AND id = ?'
)
_READ_WITH_TRANSACTION = READ_KEY_AND_TRANSACTION.format(merchant="?", key="?")
# The duplicate guard's check (api/transactions/guard.py): one probe of
# ix_transaction_duplicate_guard, run by the writer inside the create's savepoint, so creates
# racing for the same sale are judged one after the other (one writer, one write lock).
_SUSPECT = (
    'SELECT id FROM "transaction" WHERE merchant_id = ? AND terminal_id = ?'
    " AND card_fingerprint = ? AND amount = ? AND created_at >= ? AND created_at <= ?"
    " AND currency = ? AND type = 'purchase' AND status = 'approved' AND id <> ?"
    " ORDER BY created_at DESC, id LIMIT 1"
)
_OVERRIDE = 'UPDATE "transaction" SET duplicate_override = 1 WHERE merchant_id = ? AND id = ?'
# Request events (api/events/writer.py) ride the creates' commits: the same columns and
# conflict rule as the writer's own insert, so a batch put back and retried lands once.
_EVENTS = (
    "INSERT INTO request_event (event_id, ts, merchant_id, terminal_id, idempotency_key,"
    " endpoint, outcome, http_status, attempt, network, latency_ms)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (merchant_id, event_id) DO NOTHING"
)
_STOP = object()
Statements = list[tuple[str, tuple[Any, ...]]]


@dataclass(frozen=True, slots=True)
class GuardedWork:
    """A create of a merchant whose duplicate guard is on: its statements and the check."""

    statements: Statements
    probe: tuple[Any, ...]  # _SUSPECT's parameters
    allow: bool  # the cashier confirmed: write it anyway (as an override)


@dataclass(frozen=True, slots=True)
class EventRows:
    """A flush of request events (``api.events.writer.COLUMNS`` order), written in the
    writer's next batch: one transaction and one fsync with the creates queued beside it."""

    rows: list[tuple[Any, ...]]


def stored(moment: datetime | None) -> str | None:
    """A datetime as SQLAlchemy's SQLite dialect stores it (UTC, naive, microseconds)."""
    if moment is None:
        return None
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")


def _loaded(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def _maybe(text: str | None) -> datetime | None:
    return None if text is None else _loaded(text)


def statements(rows: InlineCreate) -> Statements:
    """The key insert first (it decides), then the rest of the create."""
    txn, event, created = rows.txn, rows.event, stored(rows.txn.created_at)
    processed = stored(txn.processed_at)
    out: Statements = [
        (_KEY, (txn.merchant_id, txn.id, rows.fingerprint, txn.terminal_id,
                rows.response_body, created, created)),
        (_ISSUER, (txn.merchant_id, rows.issuer_key, txn.status, txn.decline_reason,
                   txn.authorization_code, txn.amount, txn.currency, created)),
        (_TXN, (txn.merchant_id, txn.id, txn.terminal_id, txn.type, txn.amount, txn.currency,
                txn.card_last4, txn.card_brand, txn.card_fingerprint, txn.installments,
                txn.status, txn.decline_reason, txn.authorization_code,
                stored(txn.captured_at), created, processed, txn.metadata_json,
                txn.offline)),
    ]  # fmt: skip
    if rows.ledger is not None:
        ledger = rows.ledger
        out.append((_LEDGER, (ledger["entry_id"], txn.merchant_id, txn.id, ledger["amount"],
                              txn.currency, ledger["kind"], processed)))  # fmt: skip
    out.append((_OUTBOX, (event["event_id"], txn.merchant_id, event["type"], txn.id,
                          event["payload"], processed)))  # fmt: skip
    return out


# The writer's and the reader's page cache (KiB; SQLite's default is 2 MiB): the creates'
# keys are random UUIDs, so every batch touches a leaf page per index all over each B-tree;
# with 2 MiB those pages are read back from the OS for every batch once the tables outgrow
# it (measured, 30,000 creates in: writer CPU per create 140 → 100 µs for the statements).
CACHE_KIB = 64 * 1024
# WAL pages past which the writer itself checkpoints after a commit: a backstop only. The
# checkpointer thread (``_Checkpointer``) copies the WAL back every CHECKPOINT_INTERVAL
# seconds on its own connection (PASSIVE: never takes the write lock, never waits), so the
# batch whose commit crossed SQLite's default 1,000 pages no longer carries a checkpoint —
# the database file's writes and fsync — before its creates are answered.
WAL_BACKSTOP_PAGES = 20_000
CHECKPOINT_INTERVAL = 0.2


def connect(
    path: str, *, read_only: bool = False, autocheckpoint: int | None = None
) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("PRAGMA busy_timeout=30000")
    db.execute("PRAGMA foreign_keys=ON")
    db.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
    if autocheckpoint is not None:
        db.execute(f"PRAGMA wal_autocheckpoint={autocheckpoint}")
    if read_only:
        db.execute("PRAGMA query_only=ON")
    return db


class _Checkpointer:
    """A thread that runs ``PRAGMA wal_checkpoint(PASSIVE)`` every ``interval`` seconds on
    a connection of its own: it copies committed WAL frames into the database file (and
    fsyncs it, ``synchronous=FULL``) beside the writer instead of inside a batch's commit.
    Durability does not move: a commit is durable once its WAL frames are fsynced, before
    anyone is answered; a checkpoint only moves durable pages. A failing checkpoint is
    tried again at the next tick (the writer's backstop, ``WAL_BACKSTOP_PAGES``, still
    bounds the WAL)."""

    def __init__(self, path: str, interval: float = CHECKPOINT_INTERVAL) -> None:
        self._path = path
        self._interval = interval
        self._stop = threading.Event()
        self.runs = 0
        self._thread = threading.Thread(
            target=self._loop, name="idempay-sqlite-checkpointer", daemon=True
        )
        self._thread.start()

    def _loop(self) -> None:
        db: sqlite3.Connection | None = None
        while not self._stop.wait(self._interval):
            try:
                db = db or connect(self._path)
                db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                self.runs += 1
            except sqlite3.Error:
                continue
        if db is not None:
            db.close()

    async def close(self) -> None:
        self._stop.set()
        await asyncio.to_thread(self._thread.join, 30)


def _apply(db: sqlite3.Connection, work: Statements | GuardedWork) -> Any:
    """One create inside its own savepoint: True written; else the existing key row (read
    under the write lock, so it is the latest commit); or the error that undid it. With the
    guard: after the key insert decided the key is new, the check — a suspect and no
    override undoes the savepoint and answers ``DuplicateOf``."""
    guard = None
    if isinstance(work, GuardedWork):
        guard, work = work, work.statements
    db.execute("SAVEPOINT one_create")
    try:
        (key_sql, key_params), *rest = work
        if db.execute(key_sql, key_params).rowcount != 1:
            db.execute("RELEASE one_create")
            return db.execute(_READ_KEY, key_params[:2]).fetchone()
        suspect = None
        if guard is not None:
            found = db.execute(_SUSPECT, guard.probe).fetchone()
            suspect = None if found is None else str(found[0])
            if suspect is not None and not guard.allow:
                db.execute("ROLLBACK TO one_create")
                db.execute("RELEASE one_create")
                return DuplicateOf(suspect)
        for sql, params in rest:
            db.execute(sql, params)
        if suspect is not None:
            db.execute(_OVERRIDE, key_params[:2])
    except sqlite3.Error as exc:
        db.execute("ROLLBACK TO one_create")
        db.execute("RELEASE one_create")
        return exc
    db.execute("RELEASE one_create")
    return True


class _Worker:
    """A thread that runs batches of queued jobs on one connection and answers each job's
    future on its event loop once ``run_batch`` returned."""

    def __init__(
        self,
        name: str,
        opener: Callable[[], sqlite3.Connection],
        run_batch: Callable[[sqlite3.Connection, list[Any]], list[Any]],
    ) -> None:
        self._opener = opener
        self._run_batch = run_batch
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.batches = 0
        self.jobs = 0
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    async def submit(self, job: Any) -> Any:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._queue.put((job, loop, future))
        result = await future
        if isinstance(result, BaseException):
            raise result
        return result

    def _loop(self) -> None:
        db: sqlite3.Connection | None = None
        while True:
            batch = [self._queue.get()]
            while batch[-1] is not _STOP and len(batch) < MAX_BATCH:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stop = batch[-1] is _STOP
            jobs = batch[:-1] if stop else batch
            if jobs:
                try:
                    db = db or self._opener()
                    results = self._run_batch(db, [job for job, _loop, _future in jobs])
                except sqlite3.OperationalError as exc:  # cannot open, disk full, locked
                    results = [StorageUnavailableError(str(exc))] * len(jobs)
                except Exception as exc:
                    results = [exc] * len(jobs)
                self.batches += 1
                self.jobs += len(jobs)
                _answer(jobs, results)
            if stop:
                if db is not None:
                    db.close()
                return

    async def close(self) -> None:
        self._queue.put(_STOP)
        await asyncio.to_thread(self._thread.join, 30)


def _answer(jobs: list[Any], results: list[Any]) -> None:
    """One wake-up per event loop for the whole batch."""
    by_loop: dict[Any, list[tuple[Any, Any]]] = {}
    for (_job, loop, future), result in zip(jobs, results, strict=True):
        by_loop.setdefault(loop, []).append((future, result))
    for loop, answers in by_loop.items():
        try:
            loop.call_soon_threadsafe(_resolve, answers)
        except RuntimeError:  # that loop is closed: nobody is waiting; keep serving the rest
            continue


def _resolve(answers: list[tuple[Any, Any]]) -> None:
    for future, result in answers:
        if not future.done():  # the request was cancelled: its write stands or not, as done
            future.set_result(result)


def _apply_events(db: sqlite3.Connection, work: EventRows) -> Any:
    """A flush of request events inside its own savepoint: True, or the error that undid
    it (the creates beside it stand; the event writer puts its rows back)."""
    db.execute("SAVEPOINT events")
    try:
        db.executemany(_EVENTS, [(row[0], stored(row[1]), *row[2:]) for row in work.rows])
    except sqlite3.Error as exc:
        db.execute("ROLLBACK TO events")
        db.execute("RELEASE events")
        return exc
    db.execute("RELEASE events")
    return True


def _write_batch(
    db: sqlite3.Connection, jobs: list[Statements | GuardedWork | EventRows]
) -> list[Any]:
    db.execute("BEGIN IMMEDIATE")
    try:
        results = [
            _apply_events(db, work) if isinstance(work, EventRows) else _apply(db, work)
            for work in jobs
        ]
        db.execute("COMMIT")  # synchronous=FULL: durable before anyone is answered
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
    return results


def _read_batch(db: sqlite3.Connection, jobs: list[tuple[str, tuple[str, str]]]) -> list[Any]:
    return [db.execute(sql, params).fetchone() for sql, params in jobs]


class SqliteInline:
    def __init__(self, path: str) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.writer = _Worker(
            "idempay-sqlite-writer",
            lambda: connect(path, autocheckpoint=WAL_BACKSTOP_PAGES),
            _write_batch,
        )
        self.reader = _Worker(
            "idempay-sqlite-reader", lambda: connect(path, read_only=True), _read_batch
        )
        self.checkpointer = _Checkpointer(path)

    async def create(
        self, rows: InlineCreate, guard: Guard | None = None
    ) -> KeyRecord | bool | DuplicateOf:
        plain = statements(rows)
        work: Statements | GuardedWork = plain
        if guard is not None:  # the duplicate guard's check, in the same write
            txn = rows.txn
            since, until = guard.bounds(txn.created_at)
            probe = (txn.merchant_id, txn.terminal_id, guard.card_fingerprint, txn.amount,
                     stored(since), stored(until), txn.currency, txn.id)  # fmt: skip
            work = GuardedWork(plain, probe, guard.allow)
        try:
            result = await self.writer.submit(work)
        except sqlite3.IntegrityError:  # e.g. an issuer record left by a purged tombstone's
            return False  # void: the general path decides (and reports a real error)
        except sqlite3.OperationalError as exc:  # disk full, I/O error, locked too long
            raise StorageUnavailableError(str(exc)) from exc
        if isinstance(result, DuplicateOf):
            return result
        return True if result is True else _record(result) or False

    async def write_events(self, rows: list[tuple[Any, ...]]) -> None:
        """Request events in the writer's next batch, answered once that batch's COMMIT is
        durable. Raises what undid them (``StorageUnavailableError`` for a failed BEGIN or
        COMMIT, the statement's error otherwise): nothing of them stays, the caller puts
        them back."""
        try:
            await self.writer.submit(EventRows(rows))
        except sqlite3.OperationalError as exc:
            raise StorageUnavailableError(str(exc)) from exc

    async def read(self, merchant_id: str, key: str) -> KeyRecord | None:
        return _record(await self.reader.submit((_READ_KEY, (merchant_id, key))))

    async def read_transaction(self, merchant_id: str, key: str) -> StoredTransaction | None:
        return _transaction(await self.reader.submit((_READ_TRANSACTION, (merchant_id, key))))

    async def read_with_transaction(
        self, merchant_id: str, key: str
    ) -> tuple[KeyRecord | None, StoredTransaction | None]:
        row = await self.reader.submit((_READ_WITH_TRANSACTION, (merchant_id, key)))
        if row is None:
            return None, None
        txn = row[KEY_WIDTH:]
        return _record(row[:KEY_WIDTH]), _transaction(txn if txn[0] is not None else None)

    async def close(self) -> None:
        await self.writer.close()
        await self.reader.close()
        await self.checkpointer.close()


def _transaction(row: tuple[Any, ...] | None) -> StoredTransaction | None:
    if row is None:
        return None
    (id_, status, reason, code, terminal, type_, amount, currency, last4, brand,
     installments, created_at, processed_at, reversed_at, offline) = row  # fmt: skip
    return StoredTransaction(
        id_, status, reason, code, terminal, type_, amount, currency, last4, brand,
        installments, _loaded(created_at), _loaded(processed_at), _maybe(reversed_at),
        bool(offline),
    )  # fmt: skip


def _record(row: tuple[Any, ...] | None) -> KeyRecord | None:
    if row is None:
        return None
    (merchant, key, state, fingerprint, token, lease_until, request, status, body, terminal,
     created_at, deadline_at) = row  # fmt: skip
    return KeyRecord(
        merchant, key, state, fingerprint, token, _maybe(lease_until), request, status, body,
        terminal, _loaded(created_at), _maybe(deadline_at),
    )  # fmt: skip
