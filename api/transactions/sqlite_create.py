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

The WAL stays small under steady load, and a full disk is recovered from by itself
(``WalKeeper``): between batches, once the WAL file is past ``WAL_RESTART_PAGES``, the writer
runs a RESTART checkpoint (a short write pause the queue absorbs) so the next commit starts
the WAL over and trims it back to that size; on a disk short of room the WAL is also kept
under the room a checkpoint needs (and truncated, its blocks given back), and a write is
refused (503, nothing written) while there is not room for the WAL's checkpoint; a reserve
file (``RESERVE_BYTES`` next to the database) is given up when a checkpoint fails for want
of space, so the checkpoint can finish; while no checkpoint can finish, writes are refused
instead of letting the WAL take the space the checkpoint needs; the reserve is laid down
again once the disk has room for it twice.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import shutil
import sqlite3
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from api.idempotency.store import KeyRecord
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
# The WAL's bound (``WalKeeper``): past this many pages the writer restarts it between
# batches (a RESTART checkpoint), and the commit after a restart trims the file back to this
# size (``journal_size_limit``, set on every connection). A PASSIVE checkpoint cannot do it
# under steady load: the writer appends while it copies, so the WAL never starts over.
WAL_RESTART_PAGES = 1_000
BUSY_TIMEOUT_MS = 30_000
CHECKPOINT_WAIT_MS = 200  # a RESTART's wait for other writers and readers, at most
CHECKPOINT_RETRY_S = 0.5  # after a RESTART that could not finish (a long reader): try again
# Space set aside on the database's disk (a file next to it, ``<database>-reserve``) so a
# checkpoint can always finish: given up when one fails for want of space, laid down again
# when the disk has room for it twice. It covers a bounded WAL's worth of new database pages.
RESERVE_BYTES = 8 * 1024 * 1024
RESERVE_RETRY_S = 1.0
FULL_RETRY_S = 0.1  # while the disk is full: a checkpoint tried at most this often
# Room on the database's disk (its free bytes, the reserve counted) below which the WAL is
# bounded by the room too, and truncated to nothing (a TRUNCATE checkpoint) instead of
# restarted, so its blocks go back to the disk. A checkpoint grows the database file by at
# most the WAL's size; the WAL is kept under the room less ``2 * WRITE_HEADROOM_BYTES``, and
# a write is refused before it begins while the room is under the WAL plus
# ``WRITE_HEADROOM_BYTES``: what the writes let through before the next check add to the
# WAL (a create's transaction is tens of KiB; a few are let through at once).
SHORT_ROOM_BYTES = 2 * RESERVE_BYTES
WRITE_HEADROOM_BYTES = 1024 * 1024
# More room a write that claims a new key must leave: on a filling disk new keys are refused
# first, so the finishes and in-doubt settlements of the keys already claimed (whose 0200s
# are out) still fit — an approved sale is recorded, not settled in doubt for want of space.
NEW_KEY_HEADROOM_BYTES = 512 * 1024  # ~30 finishes of WAL between two checkpoints
# Request events per writer batch while the room is short: a flush of 500 events adds
# about 1.2 MB to the WAL (three B-tree pages touched per row); 16 rows stay well under
# ``WRITE_HEADROOM_BYTES``.
SHORT_EVENT_ROWS = 16
SQLITE_FULL = 13
_log = logging.getLogger("idempay.sqlite")


def wal_limit_bytes(page_size: int = 4096) -> int:
    """The WAL file's size at ``WAL_RESTART_PAGES`` (a 32-byte header, 24 bytes a frame)."""
    return 32 + WAL_RESTART_PAGES * (page_size + 24)


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


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def out_of_space(exc: BaseException | None) -> bool:
    """SQLite's SQLITE_FULL: a write or a checkpoint found the disk full — or an error
    raised while undoing one (SQLite may roll the whole transaction back on SQLITE_FULL, and
    the savepoint's ROLLBACK TO then fails: the full disk is its context)."""
    seen: list[BaseException] = []
    while exc is not None and exc not in seen:
        seen.append(exc)
        if getattr(exc, "sqlite_errorcode", None) == SQLITE_FULL or "disk is full" in str(exc):
            return True
        orig = getattr(exc, "orig", None)  # SQLAlchemy's wrapper of the driver's error
        exc = orig if isinstance(orig, BaseException) else (exc.__cause__ or exc.__context__)
    return False


class _Reserve:
    """``RESERVE_BYTES`` of real blocks (``posix_fallocate``) in a file next to the database:
    space a checkpoint can have when nothing else is left."""

    def __init__(self, path: str, size: int = RESERVE_BYTES) -> None:
        self.path = path
        self.size = size

    @property
    def held(self) -> bool:
        try:
            return os.stat(self.path).st_size >= self.size
        except OSError:
            return False

    def lay_down(self) -> bool:
        """The reserve in place; False when the disk has not room for it twice (taking the
        last free space for it would only fail the next write)."""
        if self.held:
            return True
        folder = os.path.dirname(self.path) or "."
        try:
            if shutil.disk_usage(folder).free < 2 * self.size:
                return False
        except OSError:
            return False
        scratch = f"{self.path}.{os.getpid()}.{threading.get_ident()}"
        try:
            fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.posix_fallocate(fd, 0, self.size)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(scratch, self.path)
        except OSError:
            with suppress(OSError):
                os.unlink(scratch)
            return False
        return True

    def release(self) -> bool:
        """Give the space back to the disk; True when there was a reserve to give."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            return False
        return True


Execute = Callable[[str], Any]  # runs one statement on a connection, returns its first row


class WalKeeper:
    """The WAL bound and the full disk, for every writer of one database file in this
    process: the group-commit writer thread (between its batches) and SQLAlchemy's
    connections (before each ``BEGIN IMMEDIATE``, ``api/db.py``). One per file
    (``wal_keeper``).

    Before a write: when the WAL file is past ``WAL_RESTART_PAGES`` (or the last write or
    checkpoint found the disk full) the writer about to write runs
    ``wal_checkpoint(RESTART)`` on its own connection first — it holds no transaction then,
    so the checkpoint catches up, and the next commit starts the WAL over (and trims the
    file to the bound). Most frames are already copied by the PASSIVE checkpointer, so the
    pause is the rest and one fsync. A checkpoint that cannot finish for a reader or another
    writer (``CHECKPOINT_WAIT_MS``) is tried again ``CHECKPOINT_RETRY_S`` later; one that met
    another checkpoint at work (no wait), by the next writer; the write goes on either way.

    A checkpoint must be able to grow the database file by what the WAL holds (at most the
    WAL's size). So the WAL is also kept under the room on the disk (free bytes, the reserve
    counted) less ``2 * WRITE_HEADROOM_BYTES``; while the room is under
    ``SHORT_ROOM_BYTES`` the checkpoint is a TRUNCATE, which gives the WAL's blocks back to
    the disk (a restarted WAL keeps its file), so the room goes to the database file and
    the WAL never takes the space its own checkpoint needs; and a write is refused before
    it begins (503, nothing written) while the room is under the WAL plus
    ``WRITE_HEADROOM_BYTES``. It goes through again by itself once there is room.

    A checkpoint that fails for want of space gives up the reserve and tries again at
    once. While none can finish, every write is refused before it starts (503, nothing
    written), so the space freed on the disk goes to the checkpoint, not to a WAL that only
    grows; a checkpoint is tried again every ``FULL_RETRY_S``, and the first that finishes
    lets writes through. The PASSIVE checkpointer lays the reserve down again once the disk
    has room for it twice (``maintain``)."""

    def __init__(self, path: str) -> None:
        self.wal = f"{path}-wal"
        self.folder = os.path.dirname(os.path.abspath(path))
        self.reserve = _Reserve(f"{path}-reserve")
        self.limit = wal_limit_bytes()
        self.full = False
        self.cramped = False  # writes refused: too little room for the WAL's checkpoint
        self.restarts = 0  # RESTART (or TRUNCATE) checkpoints that finished
        self.busy = 0  # RESTART checkpoints that could not finish (held by someone)
        self.refused = 0  # writes refused before they started (the disk full)
        self._next_checkpoint = 0.0
        self._next_reserve = 0.0
        self._lock = threading.Lock()  # one checkpoint decision at a time, never waited on

    def wal_bytes(self) -> int:
        return _size(self.wal)

    def room(self) -> int:
        """Free bytes on the database's disk, the reserve counted (a checkpoint gets it)."""
        try:
            free = shutil.disk_usage(self.folder).free
        except OSError:
            return 0
        return free + (self.reserve.size if self.reserve.held else 0)

    def short(self) -> bool:
        """The disk has less room than ``SHORT_ROOM_BYTES``: writes are kept small."""
        return self.room() < SHORT_ROOM_BYTES

    def before_write(self, execute: Execute, *, new_key: bool = False) -> str | None:
        """Called by a writer holding no transaction, just before it begins one: None, go
        on; else why it must not write (nothing of it may be written). ``new_key``: the write
        claims a new key, and must leave ``NEW_KEY_HEADROOM_BYTES`` more room."""
        wal, room = self.wal_bytes(), self.room()
        due = self.full or wal > self.limit or wal + 2 * WRITE_HEADROOM_BYTES > room
        if due and time.monotonic() >= self._next_checkpoint and self._lock.acquire(False):
            try:
                self._checkpoint_now(execute, truncate=room < SHORT_ROOM_BYTES)
            finally:
                self._lock.release()
            wal, room = self.wal_bytes(), self.room()
        if self.full:
            self.refused += 1
            return "no room for a checkpoint on the database's disk: nothing was written"
        if wal + WRITE_HEADROOM_BYTES > room:
            if not self.cramped:
                _log.warning("sqlite: the disk has no room for a checkpoint; writes are refused")
            self.cramped = True
            self.refused += 1
            return "no room for a checkpoint on the database's disk: nothing was written"
        if self.cramped:
            _log.warning("sqlite: the disk has room for a checkpoint; writes go through again")
            self.cramped = False
        if new_key and wal + WRITE_HEADROOM_BYTES + NEW_KEY_HEADROOM_BYTES > room:
            self.refused += 1
            return "the database's disk is nearly full: no new key is taken, nothing was written"
        return None

    def saw(self, exc: BaseException | None) -> None:
        """A write failed with ``exc``: a full disk starts the recovery."""
        if not out_of_space(exc):
            return
        if not self.full:
            _log.warning("sqlite: the disk is full; writes are refused until a checkpoint ends")
        self.full = True
        self._next_checkpoint = 0.0

    def maintain(self) -> None:
        """The reserve laid down again when it is missing and there is room (at most every
        ``RESERVE_RETRY_S``); off the request path (the PASSIVE checkpointer's thread)."""
        now = time.monotonic()
        if self.full or now < self._next_reserve:
            return
        self._next_reserve = now + RESERVE_RETRY_S
        if not self.reserve.held:
            self.reserve.lay_down()

    def _checkpoint_now(self, execute: Execute, *, truncate: bool = False) -> None:
        now = time.monotonic()
        outcome = self._checkpoint(execute, truncate)
        if outcome == "full" and self.reserve.release():
            _log.warning("sqlite: the disk is full; the reserve was given to the checkpoint")
            outcome = self._checkpoint(execute, truncate=True)
        if outcome == "full":
            if not self.full:
                _log.warning("sqlite: the disk is full; writes are refused until a checkpoint ends")
            self.full = True
            self._next_checkpoint = now + FULL_RETRY_S
        elif outcome == "done":
            if self.full:
                _log.warning("sqlite: a checkpoint finished; writes go through again")
            self.full = False
            self.restarts += 1
        else:  # someone held it: the write goes on (it tells whether the disk is still full)
            self.full = False
            self.busy += 1
            if time.monotonic() - now > CHECKPOINT_WAIT_MS / 2000:  # a reader or writer
                self._next_checkpoint = now + CHECKPOINT_RETRY_S  # (a long read): later

    def _checkpoint(self, execute: Execute, truncate: bool = False) -> str:
        """``done``, ``busy`` (someone held it), ``full`` or ``error``. ``truncate``: the
        WAL file cut to nothing once it is copied back (its blocks back to the disk)."""
        mode = "TRUNCATE" if truncate else "RESTART"
        try:
            execute(f"PRAGMA busy_timeout={CHECKPOINT_WAIT_MS}")
            try:
                busy, _frames, _copied = execute(f"PRAGMA wal_checkpoint({mode})")
            finally:
                execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        except Exception as exc:
            return "full" if out_of_space(exc) else "error"
        return "busy" if busy else "done"


_KEEPERS: dict[str, WalKeeper] = {}
_KEEPERS_LOCK = threading.Lock()


def wal_keeper(path: str) -> WalKeeper:
    """The one ``WalKeeper`` of the database file at ``path`` in this process."""
    key = os.path.realpath(path)
    with _KEEPERS_LOCK:
        keeper = _KEEPERS.get(key)
        if keeper is None:
            keeper = _KEEPERS[key] = WalKeeper(path)
        return keeper


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
            if _size(self._wal) > wal_limit_bytes():
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
