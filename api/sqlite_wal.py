"""The embedded SQLite's WAL bound and full-disk recovery (``WalKeeper``), shared by every
writer of one database file in this process: SQLAlchemy's connections (``api/db.py``, before
each ``BEGIN IMMEDIATE``) and the hot path's writer thread
(``api/transactions/sqlite_create.py``, between its batches).

The WAL stays small under steady load, and a full disk is recovered from by itself: once the
WAL file is past ``WAL_RESTART_PAGES``, the writer about to write runs a RESTART checkpoint
first (a short write pause) so the next commit starts the WAL over and trims it back to that
size; on a disk short of room the WAL is also kept under the room a checkpoint needs (and
truncated, its blocks given back), and a write is refused (503, nothing written) while there
is not room for the WAL's checkpoint; a reserve file (``RESERVE_BYTES`` next to the
database) is given up when a checkpoint fails for want of space, so the checkpoint can
finish; while no checkpoint can finish, writes are refused instead of letting the WAL take
the space the checkpoint needs; the reserve is laid down again once the disk has room for it
twice.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from typing import Any

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
SQLITE_FULL = 13
_log = logging.getLogger("idempay.sqlite")


def wal_limit_bytes(page_size: int = 4096) -> int:
    """The WAL file's size at ``WAL_RESTART_PAGES`` (a 32-byte header, 24 bytes a frame)."""
    return 32 + WAL_RESTART_PAGES * (page_size + 24)


def file_size(path: str) -> int:
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
        return file_size(self.wal)

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

    def refusing(self) -> bool:
        """A create's claim would be refused now for want of room (``before_write`` with
        ``new_key``): the disk full, or without room for the WAL's checkpoint and the new
        key's headroom. Reads are still answered (``/readyz`` says so: degraded, not down)."""
        room = self.room()
        return self.full or self.wal_bytes() + WRITE_HEADROOM_BYTES + NEW_KEY_HEADROOM_BYTES > room

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
