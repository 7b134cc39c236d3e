"""The embedded SQLite's hot-path storage: one writer thread with group commit, one reader.

The writer thread, with its own ``sqlite3`` connection (WAL, ``synchronous=FULL``, as
``api/db.py`` sets up), takes the request events' flushes queued (``write_events``, from
``api.events.writer``; up to ``MAX_BATCH``), runs ``BEGIN IMMEDIATE``, each flush inside its
own SAVEPOINT, one ``COMMIT`` — one fsync for the batch — and only then answers the batch. A
failed BEGIN or COMMIT answers the whole batch with the error (nothing of it stays; the event
writer puts the rows back). Claims and finishes (group-committed,
``api/transactions/group_commit.py``), aborts, reversals and the completer write through
SQLAlchemy's connections (``BEGIN IMMEDIATE``) and queue with this thread on the database
lock (``busy_timeout``).

Key reads go to a second thread with a read-only connection (``query_only``, autocommit):
under WAL a reader sees the last commit and takes no lock, so replays and lookups never
queue behind writers for ``BEGIN IMMEDIATE``.

The WAL stays small under steady load, and a full disk is recovered from by itself: before
each batch the writer asks the file's ``WalKeeper`` (``api/sqlite_wal.py``, shared with
SQLAlchemy's connections), which restarts a WAL past its bound and refuses a write (503,
nothing written) while there is not room for the WAL's checkpoint.
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
from api.sqlite_wal import BUSY_TIMEOUT_MS, file_size, wal_keeper, wal_limit_bytes
from api.storage_errors import StorageUnavailableError
from api.transactions.inline import (
    KEY_WIDTH,
    READ_KEY_AND_TRANSACTION,
    TRANSACTION_COLUMNS,
    StoredTransaction,
)

MAX_BATCH = 256
_READ_KEY = (
    "SELECT merchant_id, key, state, fingerprint, lease_token, lease_until, request,"
    " response_status, response_body, terminal_id, created_at, deadline_at"
    " FROM idempotency_key WHERE merchant_id = ? AND key = ?"
)
_READ_TRANSACTION = (
    f'SELECT {TRANSACTION_COLUMNS} FROM "transaction" WHERE merchant_id = ? AND id = ?'
)
_READ_WITH_TRANSACTION = READ_KEY_AND_TRANSACTION.format(merchant="?", key="?")
# Request events (api/events/writer.py): the same columns and conflict rule as the event
# writer's own insert, so a batch put back and retried lands once.
_EVENTS = (
    "INSERT INTO request_event (event_id, ts, merchant_id, terminal_id, idempotency_key,"
    " endpoint, outcome, http_status, attempt, network, latency_ms)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (merchant_id, event_id) DO NOTHING"
)
_STOP = object()


@dataclass(frozen=True, slots=True)
class EventRows:
    """A flush of request events (``api.events.writer.COLUMNS`` order), written in the
    writer's next batch: one transaction and one fsync with the flushes queued beside it."""

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


# The writer's and the reader's page cache (KiB; SQLite's default is 2 MiB): keys are random
# UUIDs, so reads and writes touch leaf pages all over each B-tree; with 2 MiB those pages
# are read back from the OS again and again once the tables outgrow it.
CACHE_KIB = 64 * 1024
# WAL pages past which the writer itself checkpoints after a commit: a backstop only. The
# checkpointer thread (``_Checkpointer``) copies the WAL back every CHECKPOINT_INTERVAL
# seconds on its own connection (PASSIVE: never takes the write lock, never waits), so the
# batch whose commit crossed SQLite's default 1,000 pages no longer carries a checkpoint —
# the database file's writes and fsync — before its writes are answered.
WAL_BACKSTOP_PAGES = 20_000
CHECKPOINT_INTERVAL = 0.2
# Request events per writer batch while the room is short: a flush of 500 events adds
# about 1.2 MB to the WAL (three B-tree pages touched per row); 16 rows stay well under
# ``WRITE_HEADROOM_BYTES``.
SHORT_EVENT_ROWS = 16


def connect(
    path: str, *, read_only: bool = False, autocheckpoint: int | None = None
) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    db.execute("PRAGMA foreign_keys=ON")
    db.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
    page_size = int(db.execute("PRAGMA page_size").fetchone()[0])
    db.execute(f"PRAGMA journal_size_limit={wal_limit_bytes(page_size)}")
    if autocheckpoint is not None:
        db.execute(f"PRAGMA wal_autocheckpoint={autocheckpoint}")
    if read_only:
        db.execute("PRAGMA query_only=ON")
    return db


class _WriterBatches:
    """The writer thread's batches (request events), each after ``WalKeeper.before_write``."""

    def __init__(self, path: str) -> None:
        self.keeper = wal_keeper(path)

    def open(self, path: str) -> sqlite3.Connection:
        return connect(path, autocheckpoint=WAL_BACKSTOP_PAGES)

    def run_batch(self, db: sqlite3.Connection, jobs: list[Any]) -> list[Any]:
        refused = self.keeper.before_write(lambda sql: db.execute(sql).fetchone())
        if refused is not None:
            return [StorageUnavailableError(refused)] * len(jobs)
        try:
            results = _write_batch(db, jobs)
        except sqlite3.Error as exc:
            self.keeper.saw(exc)
            raise
        for result in results:
            if isinstance(result, sqlite3.Error):
                self.keeper.saw(result)
        return results


class _Checkpointer:
    """A thread that runs ``PRAGMA wal_checkpoint(PASSIVE)`` every ``interval`` seconds on
    a connection of its own: it copies committed WAL frames into the database file (and
    fsyncs it, ``synchronous=FULL``) beside the writer instead of inside a batch's commit.
    Durability does not move: a commit is durable once its WAL frames are fsynced, before
    anyone is answered; a checkpoint only moves durable pages. A failing checkpoint is
    tried again at the next tick. While the WAL file is past its bound the run is skipped:
    the writer's RESTART checkpoint is due (``WalKeeper``), and copies what it can."""

    def __init__(self, path: str, interval: float = CHECKPOINT_INTERVAL) -> None:
        self._path = path
        self._wal = f"{path}-wal"
        self._interval = interval
        self._stop = threading.Event()
        self.runs = 0
        self._thread = threading.Thread(
            target=self._loop, name="idempay-sqlite-checkpointer", daemon=True
        )
        self._thread.start()

    def _loop(self) -> None:
        db: sqlite3.Connection | None = None
        keeper = wal_keeper(self._path)
        while not self._stop.wait(self._interval):
            keeper.maintain()
            if file_size(self._wal) > wal_limit_bytes():
                continue  # the writer's RESTART is due: it copies what it can, and this run
                # would only hold the checkpoint lock it needs (it would meet SQLITE_BUSY)
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
    it (the flushes beside it stand; the event writer puts its rows back)."""
    db.execute("SAVEPOINT events")
    try:
        db.executemany(_EVENTS, [(row[0], stored(row[1]), *row[2:]) for row in work.rows])
    except sqlite3.Error as exc:
        db.execute("ROLLBACK TO events")
        db.execute("RELEASE events")
        return exc
    db.execute("RELEASE events")
    return True


def _write_batch(db: sqlite3.Connection, jobs: list[EventRows]) -> list[Any]:
    db.execute("BEGIN IMMEDIATE")
    try:
        results = [_apply_events(db, work) for work in jobs]
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
        batches = _WriterBatches(path)
        self.wal = batches.keeper
        self.writer = _Worker(
            "idempay-sqlite-writer", lambda: batches.open(path), batches.run_batch
        )
        self.reader = _Worker(
            "idempay-sqlite-reader", lambda: connect(path, read_only=True), _read_batch
        )
        self.checkpointer = _Checkpointer(path)

    async def write_events(self, rows: list[tuple[Any, ...]]) -> None:
        """Request events in the writer's next batch, answered once that batch's COMMIT is
        durable. While the disk is short of room (``WalKeeper.short``) they go in batches of
        ``SHORT_EVENT_ROWS``, one after another, so no one write adds more to the WAL than
        the room kept for it. Raises what undid a batch (``StorageUnavailableError`` for a
        failed BEGIN or COMMIT, the statement's error otherwise): nothing of that batch or
        the ones after it stays; the caller puts all the rows back, and the batches already
        written land once when they are written again (``ON CONFLICT DO NOTHING``)."""
        step = SHORT_EVENT_ROWS if self.wal.short() else max(1, len(rows))
        try:
            for start in range(0, len(rows), step):
                await self.writer.submit(EventRows(rows[start : start + step]))
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
