"""The terminal's durable journal: what the terminal still owes, one row per payment.

SQLite in WAL mode with ``synchronous=FULL``: every commit is fsync'd before it returns,
so an entry written before the first send survives a process kill or a power cut. The
file's integrity, schema version and identity are checked by ``_journal_file``; every
storage failure surfaces as ``JournalError``.

    PENDING ─► SENT ─► IN_DOUBT ─► RESOLVED | ABORTED
       │         ▲        │
       │         └────────┘   (a lookup answered 404: resend with the same key)
       └──────── SENT ─► STORED ─► RESOLVED | REPORTED      (store and forward)

Any non-terminal state may move to any other non-terminal state except back to PENDING,
or to a terminal state — but STORED, a payment the terminal sold offline, is entered only
through ``store`` (from PENDING or SENT, never from IN_DOUBT: a payment that may have
reached the server is never sold offline) and leaves only for RESOLVED (the server's answer
to its advice) or REPORTED (refused for good): never ABORTED. RESOLVED, ABORTED and
REPORTED are final: a transition out of them raises ``InvalidTransitionError`` (carrying
the final entry). ``attempts`` never decreases.

**The driver's lease.** One driver per key across threads, clients and processes sharing
the file: ``begin`` writes the entry already leased to its driver, ``claim`` takes an
unfinished entry's lease (and re-reads it) only when nobody else holds it — a holder
counts while its lease runs (``lease_until``, wall clock) and its process is alive (the
owner names its pid and a per-process token, so a rebooted process that got the same pid
is not mistaken for it; a terminal's journal is on the terminal's own disk).
"""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import Any

from ._exceptions import InvalidTransitionError, JournalError
from ._journal_file import check_identity, open_database
from ._models import JournalState
from ._offline import Limit, OfflineExposure, OfflinePolicy, exposure, refusal, stamp_age

__all__ = ["Journal", "JournalEntry", "KeptClock", "new_owner", "owner_alive"]

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
        """The journaled request body, parsed (what is sent, and resent, under ``key``)."""
        parsed: dict[str, Any] = json.loads(self.request_json)
        return parsed


@dataclass(frozen=True, slots=True)
class KeptClock:
    """The server clock offset a process learned, and the clock it was learned for: the
    device time then, ``reference`` (the device clock minus the boot clock, which only a
    step of the device clock moves) and ``epoch`` (names the boot clock's origin). None for
    either: kept by an SDK that did not record it."""

    offset_s: float
    device_at: float
    reference: float | None
    epoch: str | None


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


_PROCESS = secrets.token_hex(8)  # tells this process from an earlier one with the same pid
# The owners of the drives running in this process: a lease of this process counts only
# while its drive runs. A drive that ended without giving its lease back (the release's own
# write failed: disk full) must not keep recover() in the same process off the key until
# the lease runs out.
_DRIVING: set[str] = set()


def new_owner() -> str:
    """A lease owner for one drive: ``"<pid>:<process token>:<drive token>"``."""
    return f"{os.getpid()}:{_PROCESS}:{secrets.token_hex(8)}"


def end_drive(owner: str) -> None:
    """The drive ``owner`` is over in this process (released, failed, cancelled): a lease it
    left in the file no longer counts as a live driver here."""
    _DRIVING.discard(owner)


def owner_alive(owner: str) -> bool:
    """Whether the process that wrote a lease owner is still running."""
    pid_text, _, rest = owner.partition(":")
    try:
        pid = int(pid_text)
    except ValueError:
        return False
    if pid == os.getpid():
        return rest.partition(":")[0] == _PROCESS and owner in _DRIVING
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True


class Journal:
    """A SQLite journal file. One instance per process; safe to share between threads
    and between clients (pass it as ``Client(..., journal=journal)``; the caller closes
    it). Opening checks the file's integrity and schema (``JournalError`` if it is not a
    journal). Storage failures raise ``JournalError``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._lock = threading.Lock()
        self._db, self._identity = open_database(self.path)

    def begin(
        self,
        key: str,
        request_json: str,
        *,
        deadline: float,
        reverse_late_approval: bool,
        owner: str | None = None,
        lease_until: float | None = None,
    ) -> JournalEntry:
        """Write a new PENDING entry (leased to ``owner``) and commit it (fsync) before
        anything is sent."""
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
        if owner is not None:  # before the lease is written: no claim may see it ownerless
            _DRIVING.add(owner)
        try:
            with self._open():
                try:
                    self._db.execute(
                        f"INSERT INTO journal_entry ({_COLUMNS}, lease_owner, lease_until) "
                        "VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                        (*row, owner, lease_until),
                    )
                except sqlite3.IntegrityError as exc:
                    raise JournalError(f"journal already has key {key}") from exc
        except BaseException:
            if owner is not None:
                end_drive(owner)
            raise
        return _entry(row)

    def claim(self, key: str, owner: str, *, now: float, hold_s: float) -> JournalEntry | None:
        """Re-read ``key`` and lease it to ``owner`` until ``max(deadline, now) + hold_s``.

        None when another live driver holds it (or the key is gone). A final entry is
        returned as it is, without a lease: there is nothing left to drive."""
        with self._open(), self._transaction():
            entry = self._get(key)
            if entry is None or entry.state.is_terminal:
                return entry
            holder, until = self._db.execute(
                "SELECT lease_owner, lease_until FROM journal_entry WHERE key = ?", (key,)
            ).fetchone()
            held = holder is not None and holder != owner and until is not None
            if held and until > now and owner_alive(holder):
                return None
            self._db.execute(
                "UPDATE journal_entry SET lease_owner = ?, lease_until = ? WHERE key = ?",
                (owner, max(entry.deadline, now) + hold_s, key),
            )
            _DRIVING.add(owner)
            return entry

    def release(self, key: str, owner: str) -> None:
        """Give the lease back (only if ``owner`` still holds it). The drive has ended
        whether or not this write lands."""
        end_drive(owner)
        with self._open():
            self._db.execute(
                "UPDATE journal_entry SET lease_owner = NULL, lease_until = NULL "
                "WHERE key = ? AND lease_owner = ?",
                (key, owner),
            )

    def transition(
        self,
        key: str,
        state: JournalState,
        *,
        attempts: int | None = None,
        outcome: Mapping[str, Any] | None = None,
        request_json: str | None = None,
    ) -> JournalEntry:
        """Move ``key`` to ``state`` atomically; InvalidTransitionError out of a final state.
        ``request_json`` replaces a STORED advice that stays STORED (a re-stamp, contract
        §4.12: only once the server is proven never to have processed the key)."""
        with self._open(), self._transaction():
            entry = self._get(key)
            if entry is None:
                raise JournalError(f"journal has no key {key}")
            _check(entry, state, attempts)
            stays_stored = entry.state is JournalState.STORED and state is JournalState.STORED
            if request_json is not None and not stays_stored:
                raise InvalidTransitionError(f"{key}: only a STORED advice is re-stamped")
            self._db.execute(
                "UPDATE journal_entry SET state = ?, attempts = ?, outcome = ?, "
                "request = ?, updated_at = ? WHERE key = ?",
                (
                    state.value,
                    entry.attempts if attempts is None else attempts,
                    _dump(outcome) if outcome is not None else _dump(entry.outcome),
                    entry.request_json if request_json is None else request_json,
                    _now(),
                    key,
                ),
            )
            updated = self._get(key)
        assert updated is not None
        return updated

    def store(
        self,
        key: str,
        advice_json: str,
        *,
        policy: OfflinePolicy,
        now: float,
        stamp: Mapping[str, Any] | None = None,
    ) -> JournalEntry | Limit:
        """Accept ``key`` offline: in one transaction, check ``policy`` against what is
        already stored and, if no limit is broken, make the entry STORED with its advice as
        the request (committed, fsync'd, before it returns). The broken limit otherwise,
        with nothing written. ``now``: the server's time as best known (unix seconds);
        ``stamp``: the clocks when it was stored (kept in the outcome as ``clock``: what
        its age and a re-stamp are measured on, contract §4.12)."""
        with self._open(), self._transaction():
            entry = self._get(key)
            if entry is None:
                raise JournalError(f"journal has no key {key}")
            if entry.state not in (JournalState.PENDING, JournalState.SENT):
                raise InvalidTransitionError(
                    f"{key}: {entry.state} cannot be stored offline", entry=entry
                )
            entries = self._stored()
            counters = exposure(stored.request for stored in entries)
            ages = (
                [
                    stamp_age(
                        (stored.outcome or {}).get("clock"),
                        stored.request.get("captured_at"),
                        stamp,
                    )
                    for stored in entries
                ]
                if stamp is not None
                else []
            )
            known = [age for age in ages if age is not None]
            oldest = max(known) if known else None
            limit = refusal(policy, json.loads(advice_json), counters, now=now, oldest_age_s=oldest)
            if limit is not None:
                return limit
            record: dict[str, Any] = {"kind": "stored", "stored_at": _now()}
            if stamp is not None:
                record["clock"] = dict(stamp)
            outcome = _dump(record)
            self._db.execute(
                "UPDATE journal_entry SET state = ?, request = ?, outcome = ?, updated_at = ? "
                "WHERE key = ?",
                (JournalState.STORED.value, advice_json, outcome, _now(), key),
            )
            stored = self._get(key)
        assert stored is not None
        return stored

    def stored(self) -> list[JournalEntry]:
        """The payments accepted offline and not yet forwarded (STORED), oldest first."""
        with self._open():
            return self._stored()

    def offline_exposure(self) -> OfflineExposure:
        """The risk counters: how many payments are stored, for how much per currency."""
        return exposure(entry.request for entry in self.stored())

    def get(self, key: str) -> JournalEntry | None:
        """The entry for ``key``, or None."""
        with self._open():
            return self._get(key)

    def unresolved(self) -> list[JournalEntry]:
        """Every entry not yet final (RESOLVED, ABORTED, REPORTED), oldest first."""
        return self._select("WHERE state NOT IN ('RESOLVED', 'ABORTED', 'REPORTED')")

    def entries(self) -> list[JournalEntry]:
        """Every entry, whatever its state, oldest first."""
        return self._select("")

    def clock_offset(self) -> tuple[float, float] | None:
        """The server clock offset last learned (server − device, seconds) and the device
        time it was learned at; None if none was ever kept."""
        with self._open():
            row = self._db.execute(
                "SELECT offset_s, device_at FROM journal_clock WHERE id = 1"
            ).fetchone()
        return None if row is None else (float(row[0]), float(row[1]))

    def kept_clock(self) -> KeptClock | None:
        """The server clock offset last learned, with the clock it was learned for; None if
        none was ever kept."""
        with self._open():
            row = self._db.execute(
                "SELECT offset_s, device_at, reference, epoch FROM journal_clock WHERE id = 1"
            ).fetchone()
        if row is None:
            return None
        offset, device_at, reference, epoch = row
        return KeptClock(
            float(offset),
            float(device_at),
            None if reference is None else float(reference),
            None if epoch is None else str(epoch),
        )

    def save_clock_offset(
        self,
        offset_s: float,
        *,
        device_at: float,
        reference: float | None = None,
        epoch: str | None = None,
    ) -> None:
        """Keep the server clock offset just learned (committed before it returns), with the
        clock it describes: ``reference`` (the device clock minus the boot clock then) and
        the boot clock's ``epoch``."""
        with self._open():
            self._db.execute(
                "INSERT INTO journal_clock (id, offset_s, device_at, learned_at, reference, "
                "epoch) VALUES (1, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET "
                "offset_s = excluded.offset_s, device_at = excluded.device_at, "
                "learned_at = excluded.learned_at, reference = excluded.reference, "
                "epoch = excluded.epoch",
                (offset_s, device_at, _now(), reference, epoch),
            )

    def close(self) -> None:
        """Close the database connection."""
        with self._lock:
            self._db.close()

    @contextmanager
    def _open(self) -> Iterator[None]:
        """Serialize access, check the file is still ours, and turn storage errors into
        JournalError."""
        with self._lock:
            check_identity(self.path, self._identity)
            try:
                yield
            except sqlite3.Error as exc:
                raise JournalError(f"journal {self.path}: {exc}") from exc

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

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
        with self._open():
            return self._rows(where)

    def _rows(self, where: str) -> list[JournalEntry]:
        cursor = self._db.execute(
            f"SELECT {_COLUMNS} FROM journal_entry {where} ORDER BY created_at, key"
        )
        return [_entry(row) for row in cursor.fetchall()]

    def _stored(self) -> list[JournalEntry]:
        return self._rows("WHERE state = 'STORED'")


_FROM_STORED = (JournalState.STORED, JournalState.RESOLVED, JournalState.REPORTED)


def _dump(value: Mapping[str, Any] | None) -> str | None:
    return None if value is None else json.dumps(value, separators=(",", ":"))


def _check(entry: JournalEntry, state: JournalState, attempts: int | None) -> None:
    if entry.state.is_terminal:
        raise InvalidTransitionError(
            f"{entry.key}: {entry.state} is final, cannot become {state}", entry=entry
        )
    if state is JournalState.PENDING:
        raise InvalidTransitionError(f"{entry.key}: cannot go back to PENDING")
    stored = entry.state is JournalState.STORED
    if state is JournalState.STORED and not stored:
        raise InvalidTransitionError(f"{entry.key}: only store() accepts a payment offline")
    if stored and state not in _FROM_STORED:
        raise InvalidTransitionError(
            f"{entry.key}: a payment sold offline is forwarded, never {state}", entry=entry
        )
    if state is JournalState.REPORTED and not stored:
        raise InvalidTransitionError(f"{entry.key}: only a stored payment is REPORTED")
    if attempts is not None and attempts < entry.attempts:
        raise InvalidTransitionError(f"{entry.key}: attempts cannot decrease")
