"""Inserts deferred to the end of a group-committed batch, sent as one statement per table.

A batch of finishes (``api/transactions/group_commit.py``) used to send each create's
inserts — its transaction row, its ledger entry, its outbox event — one statement, one round
trip each: three of the four statements of a finish, per create, inside a transaction that
holds many creates. Their results are never read, so inside a batch they wait: each work
adds its rows (``insert``), and the batch sends them (``flush``) after its last work and
before its COMMIT, one multi-row statement per table, in the order the tables were first
written (a ledger entry's transaction row goes first: its foreign key).

Nothing about atomicity changes: the rows are sent in the batch's transaction, before its
commit, and a batch whose flush fails commits none of them. Which work's row failed is not
known then; the batch is written again one statement at a time (``GroupCommit``), so the
failing work alone gets its error, as before. Outside a batch (no collector on the
connection) ``insert`` executes at once: every other caller is unchanged.
"""

from __future__ import annotations

from typing import Any
from weakref import WeakKeyDictionary

from sqlalchemy import Insert
from sqlalchemy.ext.asyncio import AsyncConnection

# The rows collected per connection object of a batch (not ``conn.info``: that dict lives on
# with the pooled DBAPI connection, and reading it on an invalidated connection reconnects).
_ROWS: WeakKeyDictionary[AsyncConnection, dict[Insert, list[dict[str, Any]]]] = WeakKeyDictionary()


def collect(conn: AsyncConnection) -> None:
    """From now until ``flush``, ``insert`` on ``conn`` collects its rows."""
    _ROWS[conn] = {}


async def insert(conn: AsyncConnection, statement: Insert, row: dict[str, Any]) -> None:
    """``statement`` with ``row``: collected when the connection collects, else at once."""
    rows = _ROWS.get(conn)
    if rows is None:
        await conn.execute(statement, row)
    else:
        rows.setdefault(statement, []).append(row)


async def flush(conn: AsyncConnection) -> int:
    """Send what was collected (one statement per table, first-written first) and stop
    collecting; the number of statements sent."""
    rows = _ROWS.pop(conn, None) or {}
    for statement, batch in rows.items():
        await conn.execute(statement, batch[0] if len(batch) == 1 else batch)
    return len(rows)


def take(conn: AsyncConnection) -> dict[str, list[dict[str, Any]]]:
    """Stop collecting and hand over what was collected, unsent: each table's rows by the
    table's name (the delegated finish on Citus sends them as its call's argument)."""
    rows = _ROWS.pop(conn, None) or {}
    return {statement.table.name: batch for statement, batch in rows.items()}


def discard(conn: AsyncConnection) -> None:
    """Stop collecting without sending (the batch's transaction failed)."""
    _ROWS.pop(conn, None)
