"""Chaos: cut a PostgreSQL backend while it runs a create's write — the unknown commit outcome.

A create's statement (a group-commit batch, ``CREATE_MANY``, or one create, ``CREATE``)
whose backend dies may have committed: its commit record can be in the WAL. These helpers
find such backends and end them, for a harness checking that no create answered 503 ("nothing
was processed") is committed (contract §2.2):

- ``create_backends(dsn, *, batches_only=False, waiting_on=None)``: the pids of the backends
  running a create's statement now (``waiting_on="SyncRep"``: only those waiting for a
  synchronous standby — committed locally, not yet acknowledged);
- ``cut_create_backend(dsn, *, how="kill", ...)``: waits (polling) for one such backend and
  ends it — ``"kill"``: ``kill -9`` (the postmaster then ends every backend and runs crash
  recovery: 57P02 elsewhere; needs to run on the database's host as root or its user),
  ``"terminate"``: ``pg_terminate_backend`` (57P01, no crash). Returns the pid, or None
  when none ran within ``wait_s``;
- ``cut_create_backend_sync``: the same for a synchronous harness (its own event loop).

``dsn``: a superuser's URL of the database the API writes (``postgresql://`` or SQLAlchemy's
``postgresql+asyncpg://``): only that database's backends are considered. Read-only
otherwise: nothing else is touched.
"""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Literal

import asyncpg

# A create's statements: its claim (INSERT INTO idempotency_key), its finish (UPDATE
# idempotency_key …) and their COMMIT — where a commit waits (a synchronous standby) the
# backend shows the COMMIT. ``batches_only`` is kept for callers: creates are no longer
# written in batches, so it selects the same statements.
_CREATES = """
SELECT pid FROM pg_stat_activity
WHERE state = 'active' AND pid <> pg_backend_pid() AND datname = current_database()
  AND (query LIKE '%INSERT INTO idempotency_key%' OR query LIKE '%UPDATE idempotency_key%'
       OR query LIKE 'COMMIT%')
  AND $1::boolean IS NOT NULL
  AND ($2::text IS NULL OR wait_event = $2)
ORDER BY query_start
"""

How = Literal["kill", "terminate"]


def _asyncpg_dsn(dsn: str) -> str:
    scheme, rest = dsn.split("://", 1)
    return f"{scheme.split('+', 1)[0]}://{rest}"


async def create_backends(
    dsn: str, *, batches_only: bool = False, waiting_on: str | None = None
) -> list[int]:
    """The pids of the backends running a create's statement now, oldest first."""
    conn = await asyncpg.connect(_asyncpg_dsn(dsn), timeout=5)
    try:
        rows = await conn.fetch(_CREATES, batches_only, waiting_on)
    finally:
        await conn.close()
    return [row[0] for row in rows]


async def cut_create_backend(
    dsn: str,
    *,
    how: How = "kill",
    batches_only: bool = True,
    waiting_on: str | None = None,
    wait_s: float = 5.0,
    poll_s: float = 0.005,
) -> int | None:
    """End one backend running a create's statement (the oldest), polling up to ``wait_s``
    for one to appear; its pid, or None. A database not reachable while polling (restarting)
    counts as none running yet."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    conn: asyncpg.Connection | None = None
    try:
        while loop.time() < deadline:
            try:
                if conn is None or conn.is_closed():
                    conn = await asyncpg.connect(_asyncpg_dsn(dsn), timeout=2)
                pids = [row[0] for row in await conn.fetch(_CREATES, batches_only, waiting_on)]
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
                conn = None
                await asyncio.sleep(0.1)
                continue
            if pids:
                pid: int = pids[0]
                if how == "kill":
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        continue  # it ended by itself meanwhile
                elif not await conn.fetchval("SELECT pg_terminate_backend($1)", pid):
                    continue
                return pid
            await asyncio.sleep(poll_s)
        return None
    finally:
        if conn is not None and not conn.is_closed():
            conn.terminate()


def cut_create_backend_sync(dsn: str, **options: object) -> int | None:
    """``cut_create_backend`` on an event loop of its own (a synchronous harness)."""
    return asyncio.run(cut_create_backend(dsn, **options))  # type: ignore[arg-type]
