"""Group commit for the host's store: one thread owns the SQLite connection and runs every
queued operation of a batch in one transaction (each in its own savepoint), then one
``COMMIT`` (fsynced: ``synchronous=FULL``) resolves them all.

``run(op)`` returns only after the commit that holds ``op``: the server awaits it before
it writes an answer, so an answered message is always in the store (kill -9 included).
``post(op)`` queues an operation nobody waits for (answered_at stamps). Because one thread
runs every operation in order, an operation reads and writes with no race: the RRN rules
in ``book.py`` need no locks.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from api.acquirer.host.store import connect

__all__ = ["Committer", "Op"]

T = TypeVar("T")
Op = Callable[[sqlite3.Connection], T]
_MAX_BATCH = 512


class Committer:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="acquirer-store")
        self._conn: sqlite3.Connection | None = None
        self._queue: asyncio.Queue[tuple[Op[Any], asyncio.Future[Any] | None]] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._conn = await loop.run_in_executor(self._executor, connect, self.path)
        self._task = asyncio.create_task(self._loop(), name="acquirer-store")

    async def run(self, op: Op[T]) -> T:
        """Run ``op`` in the next batch; return its result once the batch is committed."""
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((op, future))
        return await future

    def post(self, op: Op[Any]) -> None:
        """Queue ``op`` for the next batch; nobody waits for it."""
        self._queue.put_nowait((op, None))

    async def close(self) -> None:
        """Commit what is queued, then close the connection."""
        if self._task is not None:
            self._queue.put_nowait((_STOP, None))
            await self._task
            self._task = None
        if self._conn is not None:
            conn, self._conn = self._conn, None
            await asyncio.get_running_loop().run_in_executor(self._executor, conn.close)
        self._executor.shutdown(wait=True)

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        stopping = False
        while not stopping:
            batch = [await self._queue.get()]
            while len(batch) < _MAX_BATCH and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            stopping = any(op is _STOP for op, _ in batch)
            batch = [(op, fut) for op, fut in batch if op is not _STOP]
            if not batch:
                continue
            try:
                results = await loop.run_in_executor(
                    self._executor, self._commit, [op for op, _ in batch]
                )
            except Exception as exc:  # the commit failed: nobody's operation is durable
                for _, fut in batch:
                    if fut is not None and not fut.done():
                        fut.set_exception(exc)
                continue
            for (_, fut), result in zip(batch, results, strict=True):
                if fut is None or fut.done():
                    continue
                if isinstance(result, BaseException):
                    fut.set_exception(result)
                else:
                    fut.set_result(result)

    def _commit(self, ops: list[Op[Any]]) -> list[object]:
        conn = self._conn
        assert conn is not None, "store not started"
        results: list[object] = []
        conn.execute("BEGIN IMMEDIATE")
        try:
            for op in ops:
                conn.execute("SAVEPOINT op")
                try:
                    results.append(op(conn))
                except Exception as exc:
                    conn.execute("ROLLBACK TO op")
                    results.append(exc)
                conn.execute("RELEASE op")
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return results


def _stop(conn: sqlite3.Connection) -> None:
    """The marker ``close`` queues: the loop ends after the batch it arrives in."""


_STOP: Op[None] = _stop
