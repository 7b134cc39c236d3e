"""Opening the journal's SQLite file: integrity, schema version, and the file's identity.

At open: ``PRAGMA quick_check`` must answer ``ok``; ``PRAGMA user_version`` says which
schema the file holds — 0 (new, or written before versions were stamped) is brought up to
``SCHEMA_VERSION``, a newer version is refused (an older SDK must not write to it).

The file's identity (device, inode) is taken at open and checked before every operation:
a journal deleted or replaced while the terminal runs would otherwise keep taking writes
into an unlinked inode — fsync'd, and lost at the next boot.
"""

from __future__ import annotations

import os
import sqlite3

from ._exceptions import JournalError

__all__ = ["SCHEMA_VERSION", "FileIdentity", "check_identity", "open_database"]

SCHEMA_VERSION = 5
"""1: journal_entry; 2: + the driver's lease (lease_owner, lease_until); 3: + the offline
states STORED and REPORTED (store and forward). An SDK older than 3 refuses the file, so it
can never fence a payment the terminal sold offline. 4: + journal_clock, the server clock
offset last learned (so a new process while offline still stamps corrected times). 5: +
journal_clock.reference and .epoch, the clock the offset was learned for (the device clock
minus the boot clock, and the boot): an offset is used only for that same clock."""

_TABLE = """
CREATE TABLE IF NOT EXISTS {name} (
    key TEXT PRIMARY KEY,
    request TEXT NOT NULL,
    state TEXT NOT NULL
        CHECK (state IN ({states})),
    attempts INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    outcome TEXT,
    deadline REAL NOT NULL,
    reverse_late_approval INTEGER NOT NULL DEFAULT 0,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL{extra}
)"""
_V2_STATES = "'PENDING', 'SENT', 'IN_DOUBT', 'RESOLVED', 'ABORTED'"
_STATES = "'PENDING', 'SENT', 'IN_DOUBT', 'STORED', 'RESOLVED', 'ABORTED', 'REPORTED'"
_LEASE_COLUMNS = (("lease_owner", "TEXT"), ("lease_until", "REAL"))
_OPEN_INDEX = """
CREATE INDEX IF NOT EXISTS ix_journal_entry_open
    ON journal_entry (created_at) WHERE state NOT IN ('RESOLVED', 'ABORTED', 'REPORTED')"""
_CLOCK_TABLE = """
CREATE TABLE IF NOT EXISTS journal_clock (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    offset_s REAL NOT NULL,
    device_at REAL NOT NULL,
    learned_at TEXT NOT NULL
)"""
_CLOCK_COLUMNS = (("reference", "REAL"), ("epoch", "TEXT"))
_COPIED = (
    "key, request, state, attempts, outcome, deadline, reverse_late_approval, created_at, "
    "updated_at, lease_owner, lease_until"
)

FileIdentity = tuple[int, int]


def _identity(path: str) -> FileIdentity | None:
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return None
    return stat.st_dev, stat.st_ino


def check_identity(path: str, expected: FileIdentity | None) -> None:
    """JournalError when the file at ``path`` is gone or is another file than at open."""
    if expected is None:  # not a file (":memory:")
        return
    if _identity(path) != expected:
        raise JournalError(
            f"journal {path} was deleted or replaced while in use; refusing to write to a "
            "file nobody will read after a reboot"
        )


def open_database(path: str) -> tuple[sqlite3.Connection, FileIdentity | None]:
    """Connect, check integrity, bring the schema to ``SCHEMA_VERSION``."""
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30.0)
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        verdict = [row[0] for row in db.execute("PRAGMA quick_check").fetchall()]
        if verdict != ["ok"]:
            raise JournalError(f"journal {path} failed its integrity check: {verdict[:3]}")
        _migrate(db, path)
    except sqlite3.DatabaseError as exc:
        db.close()
        raise JournalError(f"journal {path} cannot be opened: {exc}") from exc
    except BaseException:
        db.close()
        raise
    memory = path == ":memory:" or path.startswith("file:")
    return db, None if memory else _identity(path)


def _migrate(db: sqlite3.Connection, path: str) -> None:
    db.execute("BEGIN IMMEDIATE")
    try:
        (version,) = db.execute("PRAGMA user_version").fetchone()
        if version > SCHEMA_VERSION:
            raise JournalError(
                f"journal {path} has schema version {version}; this SDK knows up to "
                f"{SCHEMA_VERSION} and will not write to it"
            )
        if version < SCHEMA_VERSION:
            _bring_up(db)
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def _bring_up(db: sqlite3.Connection) -> None:
    """Any older journal (or none) to the current schema, keeping every entry. SQLite cannot
    widen a CHECK constraint in place: a version-2 table is copied into a new one."""
    db.execute(_TABLE.format(name="journal_entry", states=_V2_STATES, extra=""))
    columns = {row[1] for row in db.execute("PRAGMA table_info(journal_entry)")}
    for name, kind in _LEASE_COLUMNS:
        if name not in columns:
            db.execute(f"ALTER TABLE journal_entry ADD COLUMN {name} {kind}")
    (sql,) = db.execute(
        "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'journal_entry'"
    ).fetchone()
    if "'STORED'" not in sql:
        lease = ",\n    lease_owner TEXT,\n    lease_until REAL"
        db.execute(_TABLE.format(name="journal_entry_v3", states=_STATES, extra=lease))
        db.execute(f"INSERT INTO journal_entry_v3 ({_COPIED}) SELECT {_COPIED} FROM journal_entry")
        db.execute("DROP TABLE journal_entry")  # and its index
        db.execute("ALTER TABLE journal_entry_v3 RENAME TO journal_entry")
    db.execute("DROP INDEX IF EXISTS ix_journal_entry_open")
    db.execute(_OPEN_INDEX)
    db.execute(_CLOCK_TABLE)
    clock_columns = {row[1] for row in db.execute("PRAGMA table_info(journal_clock)")}
    for name, kind in _CLOCK_COLUMNS:
        if name not in clock_columns:
            db.execute(f"ALTER TABLE journal_clock ADD COLUMN {name} {kind}")
