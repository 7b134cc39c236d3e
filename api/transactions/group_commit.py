"""Group commit of the create's writes: many claims per commit, many finishes per commit.

A create writes twice — its claim (phase 1) and its finish (phase 3) — and each write used to
be a transaction of its own: a commit, a WAL flush (an fsync on SQLite), a connection, per
create per phase. Here a write is a piece of work (``Work``: an async function of an open
connection, the same statements it ran in a transaction of its own) handed to a
``GroupCommit``, which writes what is queued together: one transaction, the works one after
the other, one commit, then every waiter is answered. One create pipeline for both backends:
Postgres and SQLite differ only in how ``atomic`` opens the batch's transaction.

- **No waiting for company.** A write starts at once when a lane (a batch's transaction) is
  free; only writes that arrive while every lane is busy wait, and they go together in the
  next batch (up to ``max_batch``). A lone create pays nothing for the batching.
- **Each waiter gets its own write's answer, or the batch's fate.** The commit succeeded:
  each work's return value. The batch failed — no connection, a statement error that ended
  the transaction, a COMMIT cut by a crash — every waiter gets that same exception, so each
  judges it as its own write would have (a claim whose end is unseen reads its key back,
  contract §2.2). A work whose own statement fails for another reason (a key held past
  ``lock_timeout``, a bug) rolls the batch back; it alone gets its error and the others are
  written again in a new transaction — the rolled-back one committed nothing.
- **A stalled batch holds no one else.** A batch still running after ``STALL_S`` (a commit
  waiting on a synchronous standby, a statement held by a lock or an I/O stall) stops
  counting against the lanes: writes queued behind it get a lane of their own, up to
  ``max_lanes`` (the connections the pool has), as each would have with a transaction of
  its own.
- **Set statements.** With ``together``, works of one ``Together`` class go as that class's
  set statements: a batch of claims (``InsertIfAbsent``) is one multi-row ``INSERT … ON
  CONFLICT DO NOTHING RETURNING``, each claim recognising its own row in what comes back; a
  batch of finishes (``service.Finish``) completes its keys in one ``UPDATE`` on Postgres.
  If such a statement fails for one row's sake, the batch is written again one work at a
  time, and the failing work alone gets its error.
- **One insert per table.** With ``defer_inserts`` (the finishes), the works' inserts whose
  results nobody reads — transaction rows, ledger entries, outbox events — are collected and
  sent after the batch's last work, one multi-row statement per table (``api.deferred``).
  If that statement fails for a reason of its own, no work can be blamed yet: the batch is
  written again with each work's inserts sent as it runs, and the failing work alone gets
  its error.
- **Partitions.** A work may name a partition (``run(work, partition=…)``): a batch holds
  the works of one partition only. On Citus the partition is the merchant, so each batch is
  a single-shard transaction on the merchant's worker — never a distributed transaction that
  a dead or moving worker would fail for every merchant in it. Lanes are counted per
  partition: a batch of one merchant in flight never holds another merchant's writes back
  (up to ``max_lanes`` batches in all, the connections the pool has).
- **No endless queue.** A work still queued after ``queue_timeout`` (``IDEMPAY_DB_TIMEOUT``:
  every lane taken by stalled batches) leaves the queue unwritten and raises
  ``StorageUnavailableError``, as a write waiting that long for a connection did.
- **A waiter that stopped waiting** (its request cancelled) before its work started is left
  out of the batch; once started, its work commits or not with the others.
- The batch's transaction runs in a task of its own: the waiter's task holds no database
  transaction (the acquirer link's guard, ``api.db.assert_no_transaction``, still holds for
  the create that goes on to send its 0200).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Generic, Protocol, TypeVar, cast

from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from api import deferred
from api.db import atomic, autocommit, insert_if_absent
from api.metrics import GROUP_COMMIT_DELEGATED, GROUP_COMMIT_TRANSACTIONS, GROUP_COMMIT_WRITES
from api.models import IdempotencyKey
from api.storage_errors import StorageUnavailableError, storage_unavailable
from api.transactions import delegated

T = TypeVar("T")
Work = Callable[[AsyncConnection], Awaitable[T]]

MAX_BATCH = 64
STALL_S = 0.1  # a batch running longer than this frees its lane for the writes queued behind
_NONE = object()  # no partition may start a batch now


class _TogetherFailed(Exception):
    """A statement sent for the whole batch (its deferred inserts, its rows inserted
    together) failed, for a reason no single work can be blamed for yet: the batch is
    written again, each work's statements on their own."""


class Together(Protocol):
    """A work whose batch-mates of its own class can be written by one set of statements
    (``GroupCommit(together=True)``): ``run_together`` gives each work's result, in order,
    where ``can_go_together`` says so for that connection; called one by one otherwise."""

    def __call__(self, conn: AsyncConnection) -> Awaitable[Any]: ...

    @classmethod
    def can_go_together(cls, conn: AsyncConnection, works: list[Any]) -> bool: ...

    @classmethod
    async def run_together(cls, conn: AsyncConnection, works: list[Any]) -> list[Any]: ...


class Delegated(Protocol):
    """A work whose batch (of its own class) can be written as one call of a function the
    database runs where the partition's rows live (``GroupCommit(delegate=True)``: Citus,
    ``api.transactions.delegated``), on an autocommit connection: ``run_delegated`` gives
    each work's result, in order, where ``can_delegate`` says so."""

    def __call__(self, conn: AsyncConnection) -> Awaitable[Any]: ...

    @classmethod
    def can_delegate(cls, works: list[Any]) -> bool: ...

    @classmethod
    async def run_delegated(cls, conn: AsyncConnection, works: list[Any]) -> list[Any]: ...


def _delegated_kind(works: list[Any]) -> type[Delegated] | None:
    """The ``Delegated`` class of a batch whose works are all of that one class and may be
    delegated together, else None."""
    kind = type(works[0])
    if (
        hasattr(kind, "run_delegated")
        and all(type(work) is kind for work in works)
        and kind.can_delegate(works)
    ):
        return cast("type[Delegated]", kind)
    return None


def _together_kind(works: list[Any]) -> type[Together] | None:
    """The ``Together`` class of a batch of two or more works all of that one class, else
    None (a mixed batch, a lone work, or a class without set statements)."""
    kind = type(works[0])
    if (
        len(works) > 1
        and hasattr(kind, "run_together")
        and all(type(work) is kind for work in works)
    ):
        return cast("type[Together]", kind)
    return None


class InsertIfAbsent:
    """A work that is one row inserted unless its key exists (``INSERT … ON CONFLICT DO
    NOTHING``): True when it inserted it. A batch of them goes as one multi-row statement
    (``_insert_together``), which tells each work whether its row went in by ``identity`` —
    columns whose values no other row of the batch shares — read back with ``RETURNING``.
    ``sent`` is called once the row's statement is about to be sent."""

    __slots__ = ("model", "row", "identity", "sent")

    def __init__(
        self,
        model: Any,
        row: dict[str, Any],
        identity: tuple[str, ...],
        sent: Callable[[], None] = lambda: None,
    ) -> None:
        self.model = model
        self.row = row
        self.identity = identity
        self.sent = sent

    def __call__(self, conn: AsyncConnection) -> Awaitable[bool]:
        self.sent()
        return insert_if_absent(conn, self.model, self.row)

    @classmethod
    def can_go_together(cls, conn: AsyncConnection, works: list[Any]) -> bool:
        return all(work.model is works[0].model for work in works)

    @classmethod
    async def run_together(cls, conn: AsyncConnection, works: list[Any]) -> list[Any]:
        return await _insert_together(conn, works)

    @classmethod
    def can_delegate(cls, works: list[Any]) -> bool:
        return all(work.model is IdempotencyKey for work in works)

    @classmethod
    async def run_delegated(cls, conn: AsyncConnection, works: list[Any]) -> list[Any]:
        """Claims of one merchant as one ``idempay_claim`` call (Citus), in key order as
        ``_insert_together``; of two rows of one key, the first queued goes in."""
        order = sorted(range(len(works)), key=lambda n: works[n].row["key"])
        for work in works:
            work.sent()
        claims = [works[n].row for n in order]
        won = await delegated.call(
            conn, delegated.CLAIM_CALL, claims[0]["merchant_id"], delegated.dumps(claims)
        )
        inserted = {order[position] for position in won}
        return [n in inserted for n in range(len(works))]


_INSERT_TOGETHER: dict[tuple[str, str, tuple[str, ...]], Any] = {}


def _insert_returning(table: Any, dialect: str, identity: tuple[str, ...]) -> Any:
    """``INSERT … ON CONFLICT DO NOTHING RETURNING <identity>``, built once per table,
    dialect and identity: executed with the batch's rows as its parameter list, SQLAlchemy
    sends it as one multi-row ``VALUES`` ("insertmanyvalues"); a statement built per batch
    with ``.values([...])`` cost a cache key over every value (measured: 11 % of the server's
    CPU under creates)."""
    cache_key = (table.name, dialect, identity)
    statement = _INSERT_TOGETHER.get(cache_key)
    if statement is None:
        module = postgresql if dialect == "postgresql" else sqlite
        statement = (
            module.insert(table)
            .on_conflict_do_nothing()
            .returning(*(table.c[name] for name in identity))
        )
        _INSERT_TOGETHER[cache_key] = statement
    return statement


async def _insert_together(conn: AsyncConnection, works: list[InsertIfAbsent]) -> list[bool]:
    """One ``INSERT … VALUES (…), (…) ON CONFLICT DO NOTHING RETURNING <identity>`` for the
    works' rows, in key order (batches meeting on the same keys lock them in one order); of
    two rows of one key, the first queued goes in and the other finds it."""
    first = works[0]
    statement = _insert_returning(first.model.__table__, conn.dialect.name, first.identity)
    rows = sorted((work.row for work in works), key=lambda row: (row["merchant_id"], row["key"]))
    for work in works:
        work.sent()
    inserted = {tuple(row) for row in (await conn.execute(statement, rows)).all()}
    return [tuple(w.row[name] for name in w.identity) in inserted for w in works]


class _WorkFailed(Exception):
    """One work's own statement failed: the batch rolls back without it."""

    def __init__(self, index: int, error: Exception) -> None:
        super().__init__(repr(error))
        self.index = index
        self.error = error


class GroupCommit(Generic[T]):
    """Writes queued works in shared transactions (module docstring). ``lanes``: batches of
    one partition in flight at once (each holds one connection of the engine's pool), more
    while batches stall; ``max_lanes``: batches in flight in all; ``kind`` labels its
    metrics; ``prologue``: the statements run first in each batch's transaction (the claims'
    ``lock_timeout``);
    ``new_key``: the batch claims new keys (``atomic``'s option: refused first on a nearly
    full SQLite disk)."""

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        kind: str,
        lanes: int,
        max_lanes: int | None = None,
        max_batch: int = MAX_BATCH,
        prologue: str | tuple[str, ...] | None = None,
        new_key: bool = False,
        queue_timeout: float | None = None,
        defer_inserts: bool = False,
        together: bool = False,
        delegate: bool = False,
    ) -> None:
        self.engine = engine
        # Citus: a batch of ``Delegated`` works is one call, on an autocommit connection
        self._delegate = (
            engine.execution_options(isolation_level="AUTOCOMMIT") if delegate else None
        )
        self._transactions = GROUP_COMMIT_TRANSACTIONS.labels(kind)
        self._writes = GROUP_COMMIT_WRITES.labels(kind)
        self._delegated = GROUP_COMMIT_DELEGATED.labels(kind)
        self.lanes = max(1, lanes)
        self.max_lanes = max(self.lanes, max_lanes or self.lanes)
        self.max_batch = max(1, max_batch)
        self.prologue: tuple[str, ...] = (
            () if prologue is None else (prologue,) if isinstance(prologue, str) else prologue
        )
        self.new_key = new_key
        self.queue_timeout = queue_timeout
        self.defer_inserts = defer_inserts
        self.together = together
        self._pending: list[tuple[Work[T], asyncio.Future[T]]] = []
        # batch number → when it started (loop time) and its partition
        self._running: dict[int, tuple[float, object]] = {}
        self._partitions: dict[int, object] = {}  # id(future) → its work's partition
        self._queued: dict[object, int] = {}  # partition → its works in ``_pending``
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.batches = 0  # transactions begun (committed or not): for tests and the benchmark
        self.delegated_calls = 0  # of them, sent as one delegated call
        self.writes = 0

    async def run(self, work: Work[T], *, partition: object = None) -> T:
        """``work``'s result once its batch has committed; else the batch's error (or the
        work's own). A work still queued after ``queue_timeout`` (every lane taken by
        stalled batches) is taken out of the queue, never written, and raises
        ``StorageUnavailableError`` — as a write waiting that long for a connection would."""
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        entry = (work, future)
        self._pending.append(entry)
        self._partitions[id(future)] = partition
        self._queued[partition] = self._queued.get(partition, 0) + 1
        self._start()
        try:
            done, _ = await asyncio.wait({future}, timeout=self.queue_timeout)
        except BaseException:
            future.cancel()  # its waiter stopped waiting: left out if not started yet
            raise
        if not done and entry in self._pending:
            self._pending.remove(entry)
            self._unqueue(self._partitions.pop(id(future), None))
            future.cancel()
            raise StorageUnavailableError("no lane for the write in time: nothing was written")
        return await future

    def _next_partition(self, now: float) -> object:
        """The partition of the oldest queued work that may start a batch now — fewer than
        ``lanes`` batches of its partition running, plus one per batch of it stalled past
        ``STALL_S`` — or ``_NONE``. Lanes are counted per partition: on Citus a batch of one
        merchant never holds another merchant's writes (one partition elsewhere: the lanes
        are the whole committer's)."""
        running: dict[object, int] = {}
        stalled: dict[object, int] = {}
        for started, partition in self._running.values():
            running[partition] = running.get(partition, 0) + 1
            if now - started >= STALL_S:
                stalled[partition] = stalled.get(partition, 0) + 1
        seen: set[object] = set()
        for _work, future in self._pending:
            partition = self._partitions.get(id(future))
            if partition in seen:
                continue
            seen.add(partition)
            capacity = min(self.max_lanes, self.lanes + stalled.get(partition, 0))
            if running.get(partition, 0) < capacity:
                return partition
            if len(seen) == len(self._queued):  # every queued partition looked at
                break
        return _NONE

    def _unqueue(self, partition: object) -> None:
        left = self._queued.get(partition, 0) - 1
        if left > 0:
            self._queued[partition] = left
        else:
            self._queued.pop(partition, None)

    def _start(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending and len(self._running) < self.max_lanes:
            partition = self._next_partition(loop.time())
            if partition is _NONE:
                break
            batch = self._take(partition)
            self.batches += 1
            number = self.batches
            self._running[number] = (loop.time(), partition)
            task = asyncio.create_task(self._write(number, batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        if self._pending and self._timer is None and len(self._running) < self.max_lanes:
            self._timer = loop.call_later(STALL_S, self._tick)  # look again for a stall

    def _take(self, partition: object) -> list[tuple[Work[T], asyncio.Future[T]]]:
        """The next batch of ``partition``: its oldest queued work and those queued after it,
        up to ``max_batch``."""
        batch: list[tuple[Work[T], asyncio.Future[T]]] = []
        rest: list[tuple[Work[T], asyncio.Future[T]]] = []
        for entry in self._pending:
            same = self._partitions.get(id(entry[1])) == partition
            (batch if same and len(batch) < self.max_batch else rest).append(entry)
        self._pending = rest
        for _work, future in batch:
            self._unqueue(self._partitions.pop(id(future), None))
        return batch

    def _tick(self) -> None:
        self._timer = None
        self._start()

    async def _write(self, number: int, batch: list[tuple[Work[T], asyncio.Future[T]]]) -> None:
        together = True  # the batch's statements for all its works, where it has them
        try:
            while True:
                batch = [(work, future) for work, future in batch if not future.done()]
                if not batch:
                    return
                try:
                    failed = await self._attempt(batch, together=together)
                except _TogetherFailed:
                    together = False  # again, each work's statements on their own
                    self.batches += 1
                    continue
                if failed is None:
                    return
                del batch[failed]  # answered with its own error; the rest go again
                self.batches += 1
        finally:
            del self._running[number]
            self._start()

    async def _attempt(
        self, batch: list[tuple[Work[T], asyncio.Future[T]]], *, together: bool
    ) -> int | None:
        """One transaction for ``batch``: None when every waiter was answered, else the index
        of the one work that failed on its own (answered; the transaction rolled back).
        ``together``: works of one ``Together`` class written by its set statements
        (``together``), and the works' deferred inserts sent in one statement per table after
        the last work (``defer_inserts``, ``api.deferred``); if such a statement fails for a
        reason of its own, ``_TogetherFailed``."""
        rows = [work for work, _future in batch]
        if together and self._delegate is not None:
            delegated = _delegated_kind(rows)
            if delegated is not None:
                await self._call(batch, delegated, self._delegate)
                return None
        self._transactions.inc()
        results: list[Any] = []
        defer = together and self.defer_inserts and len(batch) > 1
        kind = _together_kind(rows) if together and self.together else None
        try:
            async with atomic(self.engine, new_key=self.new_key) as conn:
                for statement in self.prologue:
                    await conn.exec_driver_sql(statement)
                if defer:
                    deferred.collect(conn)
                try:
                    if kind is not None and kind.can_go_together(conn, rows):
                        try:
                            results = await kind.run_together(conn, rows)
                        except Exception as exc:
                            if storage_unavailable(exc):
                                raise  # the batch's fate: every waiter gets it
                            raise _TogetherFailed(repr(exc)) from exc
                        rows = []
                    for index, work in enumerate(rows):
                        try:
                            results.append(await work(conn))
                        except Exception as exc:
                            if len(batch) == 1 or storage_unavailable(exc):
                                raise  # the batch's fate: every waiter gets it
                            raise _WorkFailed(index, exc) from exc
                    if defer:
                        try:
                            await deferred.flush(conn)
                        except Exception as exc:
                            if len(batch) == 1 or storage_unavailable(exc):
                                raise  # the batch's fate (one work's: its own error)
                            raise _TogetherFailed(repr(exc)) from exc
                finally:
                    deferred.discard(conn)
        except _TogetherFailed:
            raise
        except _WorkFailed as failed:
            _answer(batch[failed.index][1], error=failed.error)
            return failed.index
        except BaseException as exc:
            for _work, future in batch:
                _answer(future, error=exc)
            if not isinstance(exc, Exception):
                raise
            return None
        self.writes += len(batch)
        self._writes.inc(len(batch))
        for (_work, future), result in zip(batch, results, strict=True):
            _answer(future, result=result)
        return None

    async def _call(
        self,
        batch: list[tuple[Work[T], asyncio.Future[T]]],
        kind: type[Delegated],
        engine: AsyncEngine,
    ) -> None:
        """``batch`` as one delegated call (its own transaction on the partition's node):
        every waiter answered. A call of several works that fails for a reason of its own
        (a key held past the lock timeout) raises ``_TogetherFailed``: the batch is written
        again as a transaction, each work's statements on their own, and the failing work
        alone gets its error."""
        self._transactions.inc()
        self._delegated.inc()
        self.delegated_calls += 1
        try:
            async with autocommit(engine) as conn:
                results = await kind.run_delegated(conn, [work for work, _future in batch])
        except Exception as exc:
            if len(batch) > 1 and not storage_unavailable(exc):
                raise _TogetherFailed(repr(exc)) from exc
            for _work, future in batch:
                _answer(future, error=exc)
            return
        except BaseException as exc:
            for _work, future in batch:
                _answer(future, error=exc)
            raise
        self.writes += len(batch)
        self._writes.inc(len(batch))
        for (_work, future), result in zip(batch, results, strict=True):
            _answer(future, result=result)

    async def close(self) -> None:
        """Wait for the batches in flight (the server's shutdown, after the last request)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)


def _answer(
    future: asyncio.Future[Any], *, result: Any = None, error: BaseException | None = None
) -> None:
    if future.done():  # its waiter stopped waiting
        return
    if error is not None and not isinstance(error, Exception):
        future.cancel()  # the batch itself was cancelled (the server stopping)
    elif error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
