"""The acquirer host's own durable store (SQLite, WAL, ``synchronous=FULL``).

Two tables::

    message        every message received: mti, stan, rrn, received_at, ``duplicate`` (a
                   repeated 0200 or reversal of its RRN), what became of it (``fate``:
                   pending → answered | withheld | answer_dropped | connection_dropped |
                   connection_closed | dropped_before_decision), answered_at and the
                   response code it was answered with
    authorization  one row per RRN: the 0200's data (merchant and terminal from field 48,
                   processing code, amount, currency), the decision (``state`` received |
                   approved | declined, response and authorization codes, approved_at),
                   reversed_at, and how many 0200s arrived for it (``requests``)

An authorization row moves only forward::

    (none) ──0200──► received ──► approved | declined      (the decision, committed before
    (none) ──0400/0420──► reversal first (requests = 0)     any answer is written)
    approved ──0400/0420──► approved + reversed_at          (idempotent: first one wins)

The writes are functions of an open ``sqlite3.Connection`` run by the ``Committer`` (one
thread, many operations per commit). ``summary`` and ``net_approvals`` are the read API
the invariant checkers use; they open the file read-only and may run while the host does.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

__all__ = [
    "AuthorizationRow",
    "RrnSummary",
    "connect",
    "messages",
    "net_approvals",
    "now_iso",
    "read_authorization",
    "summary",
]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS message (
    id INTEGER PRIMARY KEY,
    connection INTEGER NOT NULL,
    mti TEXT NOT NULL,
    stan TEXT,
    rrn TEXT,
    received_at TEXT NOT NULL,
    fate TEXT NOT NULL,
    duplicate INTEGER NOT NULL DEFAULT 0,
    answered_at TEXT,
    response_mti TEXT,
    response_code TEXT
);
CREATE INDEX IF NOT EXISTS message_rrn ON message (rrn);
CREATE TABLE IF NOT EXISTS authorization (
    rrn TEXT PRIMARY KEY,
    stan TEXT,
    merchant_id TEXT,
    terminal_id TEXT,
    processing_code TEXT,
    amount INTEGER,
    currency TEXT,
    state TEXT NOT NULL,
    response_code TEXT,
    authorization_code TEXT,
    requests INTEGER NOT NULL,
    first_received_at TEXT NOT NULL,
    decided_at TEXT,
    approved_at TEXT,
    reversed_at TEXT,
    reversal_mti TEXT
);
CREATE INDEX IF NOT EXISTS authorization_approved_at ON authorization (approved_at);
"""


def now_iso() -> str:
    """The acquirer's clock, UTC, as stored (fixed width, so text order is time order)."""
    return datetime.now(UTC).isoformat(timespec="microseconds")


def connect(path: Path) -> sqlite3.Connection:
    """The host's one writing connection: WAL, every commit fsynced, explicit transactions."""
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA busy_timeout=10000")
    # a small WAL: checkpointed every 256 pages (1 MiB) and trimmed back to it, so the host's
    # store sharing a small disk with the server's database never holds SQLite's default 4 MiB
    conn.execute("PRAGMA wal_autocheckpoint=256")
    conn.execute(f"PRAGMA journal_size_limit={1024 * 1024}")
    conn.executescript(_SCHEMA)
    return conn


@dataclass(frozen=True, slots=True)
class AuthorizationRow:
    rrn: str
    stan: str | None
    merchant_id: str | None
    terminal_id: str | None
    processing_code: str | None
    amount: int | None
    currency: str | None
    state: str  # received | approved | declined
    response_code: str | None
    authorization_code: str | None
    requests: int
    approved_at: str | None
    reversed_at: str | None


def read_authorization(conn: sqlite3.Connection, rrn: str) -> AuthorizationRow | None:
    row = conn.execute(
        "SELECT rrn, stan, merchant_id, terminal_id, processing_code, amount, currency, state,"
        " response_code, authorization_code, requests, approved_at, reversed_at"
        " FROM authorization WHERE rrn = ?",
        (rrn,),
    ).fetchone()
    return None if row is None else AuthorizationRow(*row)


@dataclass(frozen=True, slots=True)
class RrnSummary:
    """What the acquirer knows of one RRN, for the invariant checkers."""

    rrn: str
    requests: int  # 0200s received (SPEC §8: at most one per key)
    approved: bool
    reversed: bool
    state: str  # received | approved | declined
    response_code: str | None
    amount: int | None
    currency: str | None
    processing_code: str | None
    merchant_id: str | None
    terminal_id: str | None
    authorization_code: str | None
    approved_at: str | None  # ISO 8601, UTC, the acquirer's clock
    reversed_at: str | None


@contextmanager
def _read_only(path: Path) -> Iterator[sqlite3.Connection]:
    if not path.exists():
        raise FileNotFoundError(f"no acquirer store at {path}")
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        conn.execute("PRAGMA busy_timeout=10000")
        yield conn


def summary(path: Path | str) -> dict[str, RrnSummary]:
    """Per RRN: 0200s received, approved?, reversed?, amount, currency, processing code."""
    with _read_only(Path(path)) as conn:
        rows = conn.execute(
            "SELECT rrn, requests, state = 'approved', reversed_at IS NOT NULL, state,"
            " response_code, amount, currency, processing_code, merchant_id, terminal_id,"
            " authorization_code, approved_at, reversed_at FROM authorization ORDER BY rrn"
        ).fetchall()
    return {
        r[0]: RrnSummary(
            rrn=r[0],
            requests=r[1],
            approved=bool(r[2]),
            reversed=bool(r[3]),
            state=r[4],
            response_code=r[5],
            amount=r[6],
            currency=r[7],
            processing_code=r[8],
            merchant_id=r[9],
            terminal_id=r[10],
            authorization_code=r[11],
            approved_at=r[12],
            reversed_at=r[13],
        )
        for r in rows
    }


def net_approvals(path: Path | str) -> set[str]:
    """The RRNs the acquirer approved and that were not reversed."""
    with _read_only(Path(path)) as conn:
        rows = conn.execute(
            "SELECT rrn FROM authorization WHERE state = 'approved' AND reversed_at IS NULL"
        ).fetchall()
    return {str(r[0]) for r in rows}


def messages(path: Path | str, *, rrn: str | None = None) -> list[dict[str, object]]:
    """The message log (oldest first), optionally for one RRN — for tests and operators."""
    where, args = ("WHERE rrn = ?", (rrn,)) if rrn is not None else ("", ())
    with _read_only(Path(path)) as conn:
        conn.row_factory = sqlite3.Row
        rows = conn.execute(f"SELECT * FROM message {where} ORDER BY id", args).fetchall()
    return [dict(r) for r in rows]
