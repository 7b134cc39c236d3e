"""The Postgres sessions of a leader-elected process (the webhook worker, the outbox relay),
bounded by its lease, so that a process stopped anywhere (SIGSTOP, a frozen VM) keeps
nothing from its standby for longer than that.

- the session holding the leadership lock carries ``idle_session_timeout = lease`` and the
  process's ``application_name`` (``lock_session``): a leader stopped between two
  transactions loses it to the database;
- every transaction on the process's engine (``bounded``) carries
  ``idle_in_transaction_session_timeout = lease`` and the same ``application_name`` (both
  ``LOCAL``): ``idle_session_timeout`` ends only a session outside a transaction, so a
  leader stopped between two statements of one would keep it, and its locks, for good;
- each process, leading or waiting to, ends the sessions of another process of its kind
  whose transaction began more than a lease ago (``end_stale``): Postgres cannot end all of
  these itself, since a client stopped between a statement's parse and its execution
  (asyncpg prepares a new statement, then binds it) leaves the session "active", waiting
  for the client, which neither an idle timeout nor ``statement_timeout`` ends (Postgres 15).

A process's name is ``<kind> <id>`` (``idempay-webhooks 1f…``, ``idempay-relay 9c…``). All
of it is a no-op on SQLite, where one process runs alone.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from sqlalchemy import event, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine


def name(kind: str) -> str:
    """A new process's ``application_name``: its kind and a random id."""
    return f"{kind} {uuid.uuid4().hex[:12]}"


def bounded(engine: AsyncEngine, tag: str, lease: Callable[[], float]) -> AsyncEngine:
    """``engine`` (the same pool) whose every transaction, on Postgres, is named ``tag``
    and ends its session once left idle in it for ``lease()`` seconds; both ``LOCAL``, so
    a pooled session goes back to the engine's other users as it was."""
    if engine.dialect.name != "postgresql":
        return engine
    copy = engine.execution_options()  # a copy: its listeners are its own

    @event.listens_for(copy.sync_engine, "begin")
    def _bound(conn: Any) -> None:
        conn.exec_driver_sql(
            f"SELECT set_config('application_name', '{tag}', true), "
            f"set_config('idle_in_transaction_session_timeout', '{ms(lease())}', true)"
        )

    return copy


def ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


async def lock_session(conn: AsyncConnection, tag: str, lease: float) -> None:
    """Make ``conn``'s session (the one to hold the leadership lock) end by itself once
    idle for ``lease`` seconds, and name it ``tag`` (Postgres; no-op on SQLite). Close it
    (``conn.invalidate()``) rather than hand it back to the pool."""
    if conn.dialect.name != "postgresql":
        return
    await conn.execute(text(f"SET idle_session_timeout = {ms(lease)}"))
    await conn.execute(text(f"SET application_name = '{tag}'"))
    await conn.commit()


async def end_stale(conn: AsyncConnection, kind: str, tag: str, lease: float) -> list[Any]:
    """End the sessions of other processes of ``kind`` (this database, this role) whose
    transaction began more than ``lease`` seconds ago; the (pid, application_name) of each
    ended. Their process has stopped: a live one's transactions last milliseconds and its
    ticks are bounded by the lease, and what they hold (the leadership lock, the numbering's
    lock, rows) would otherwise stay held."""
    if conn.dialect.name != "postgresql":
        return []
    ended = (
        await conn.execute(
            text(
                # chosen first, then ended: no session outside the choice is ever ended
                "WITH stale AS MATERIALIZED (SELECT pid, application_name FROM pg_stat_activity"
                " WHERE datname = current_database() AND usename = current_user"
                " AND application_name LIKE :kind AND application_name <> :me"
                " AND xact_start < clock_timestamp() - make_interval(secs => :lease)) "
                "SELECT pid, application_name FROM stale WHERE pg_terminate_backend(pid)"
            ),
            {"kind": f"{kind} %", "me": tag, "lease": float(lease)},
        )
    ).all()
    await conn.commit()
    return list(ended)
