"""The terminal's durable journal: what the terminal still owes, one row per payment.

SQLite in WAL mode with ``synchronous=FULL``: every commit is fsync'd before it returns,
so an entry written before the first send survives a process kill or a power cut.

    PENDING ─► SENT ─► IN_DOUBT ─► RESOLVED | ABORTED
                 ▲        │
                 └────────┘   (a lookup answered 404: resend with the same key)

Any non-terminal state may move to any other non-terminal state except back to PENDING,
or to a terminal state. RESOLVED and ABORTED are final: a transition out of them raises
``InvalidTransition``. ``attempts`` never decreases.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import Any

from ._exceptions import InvalidTransition, JournalError
from ._models import JournalState

__all__ = ["Journal", "JournalEntry"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS journal_entry (
    key TEXT PRIMARY KEY,
    request TEXT NOT NULL,
    state TEXT NOT NULL
        CHECK (state IN ('PENDING', 'SENT', 'IN_DOUBT', 'RESOLVED', 'ABORTED')),
    attempts INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    outcome TEXT,
    deadline REAL NOT NULL,
    reverse_late_approval INTEGER NOT NULL DEFAULT 0,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS ix_journal_entry_open
    ON journal_entry (created_at) WHERE state NOT IN ('RESOLVED', 'ABORTED');
"""

_COLUMNS = (
    "key, request, state, attempts, outcome, deadline, reverse_late_approval, "
    "created_at, updated_at"
)


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """One payment as the journal knows it. ``deadline`` is unix seconds."""

    key: str
    request_json: str
    state: JournalState
    attempts: int
    outcome: Mapping[str, Any] | None
    deadline: float
    reverse_late_approval: bool
    created_at: datetime
    updated_at: datetime

    @property
    def request(self) -> dict[str, Any]:
        parsed: dict[str, Any] = json.loads(self.request_json)
        return parsed


def _entry(row: tuple[Any, ...]) -> JournalEntry:
    key, request, state, attempts, outcome, deadline, reverse, created, updated = row
    return JournalEntry(
        key=key,
        request_json=request,
        state=JournalState(state),
        attempts=attempts,
        outcome=None if outcome is None else json.loads(outcome),
        deadline=deadline,
        reverse_late_approval=bool(reverse),
        created_at=datetime.fromisoformat(created),
        updated_at=datetime.fromisoformat(updated),
    )


def _now() -> str:
    return datetime.now(UTC).isoformat()


class Journal:
    """A SQLite journal file. One instance per process; safe to share between threads."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(
            self.path, isolation_level=None, check_same_thread=False, timeout=30.0
        )
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)

    def begin(
        self, key: str, request_json: str, *, deadline: float, reverse_late_approval: bool
    ) -> JournalEntry:
        """Write a new PENDING entry and commit it (fsync) before anything is sent."""
        now = _now()
        row = (
            key,
            request_json,
            JournalState.PENDING.value,
            0,
            None,
            deadline,
            int(reverse_late_approval),
            now,
            now,
        )
        with self._lock:
            try:
                self._db.execute(
                    f"INSERT INTO journal_entry ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?)", row
                )
            except sqlite3.IntegrityError as exc:
                raise JournalError(f"journal already has key {key}") from exc
        return _entry(row)

    def transition(
        self,
        key: str,
        state: JournalState,
        *,
        attempts: int | None = None,
        outcome: Mapping[str, Any] | None = None,
    ) -> JournalEntry:
        """Move ``key`` to ``state`` atomically; InvalidTransition out of a final state."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                entry = self._get(key)
                if entry is None:
                    raise JournalError(f"journal has no key {key}")
                _check(entry, state, attempts)
                self._db.execute(
                    "UPDATE journal_entry SET state = ?, attempts = ?, outcome = ?, "
                    "updated_at = ? WHERE key = ?",
                    (
                        state.value,
                        entry.attempts if attempts is None else attempts,
                        _dump(outcome) if outcome is not None else _dump(entry.outcome),
                        _now(),
                        key,
                    ),
                )
                updated = self._get(key)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        assert updated is not None
        return updated

    def get(self, key: str) -> JournalEntry | None:
        with self._lock:
            return self._get(key)

    def unresolved(self) -> list[JournalEntry]:
        """Every entry not yet RESOLVED or ABORTED, oldest first."""
        return self._select("WHERE state NOT IN ('RESOLVED', 'ABORTED')")

    def entries(self) -> list[JournalEntry]:
        return self._select("")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> Journal:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _get(self, key: str) -> JournalEntry | None:
        cursor = self._db.execute(f"SELECT {_COLUMNS} FROM journal_entry WHERE key = ?", (key,))
        row = cursor.fetchone()
        return None if row is None else _entry(row)

    def _select(self, where: str) -> list[JournalEntry]:
        with self._lock:
            cursor = self._db.execute(
                f"SELECT {_COLUMNS} FROM journal_entry {where} ORDER BY created_at, key"
            )
            return [_entry(row) for row in cursor.fetchall()]


def _dump(value: Mapping[str, Any] | None) -> str | None:
    return None if value is None else json.dumps(value, separators=(",", ":"))


def _check(entry: JournalEntry, state: JournalState, attempts: int | None) -> None:
    if entry.state.is_terminal:
        raise InvalidTransition(f"{entry.key}: {entry.state} is final, cannot become {state}")
    if state is JournalState.PENDING:
        raise InvalidTransition(f"{entry.key}: cannot go back to PENDING")
    if attempts is not None and attempts < entry.attempts:
        raise InvalidTransition(f"{entry.key}: attempts cannot decrease")
