"""Request events (contract §5): one per request, appended through a bounded in-memory queue
and flushed in batches by a background task, so the request path never waits on them.

The request path only appends its ``Event`` to the queue; the writer builds the rows. Each
event gets its ``event_id`` when a flush first takes it (unless it came with one), and the
flush inserts with ``ON CONFLICT (merchant_id, event_id) DO NOTHING`` (the table's key since
migration 0008, the one a Citus shard can check too): a batch retried after an error —
even one whose COMMIT succeeded and whose reply was lost — lands once, because a flush that
fails or is cancelled puts its batch back on the queue as the rows it built, ids included.
On Postgres a batch is one ``INSERT … SELECT FROM unnest(…)`` statement (one array per
column, an asyncpg prepared statement on a connection of the engine's pool, in its own
transaction); on SQLite one executemany in a transaction.

On Citus (``citus``: the app's start-up probe, ``api.main``) a batch is split by
merchant, and each merchant's rows go in multi-row ``INSERT … VALUES`` statements of 64,
32, …, 1 rows (seven statement texts, each prepared once per connection), each in its own
transaction: every statement is routed to the merchant's shard, one task on one worker.
``INSERT … SELECT FROM unnest`` would be planned there as an insert-select that pulls the
whole batch to the coordinator and writes every merchant's shard in one distributed
transaction, so one worker down would hold back every merchant's events. A statement that
fails puts back that merchant's rows only (the rest of its rows in this flush too); the
other merchants' rows land.

Shutdown (``close``) stops the periodic loop, lets a flush under way finish and drains the
queue — retrying a flush that fails, e.g. while the database restarts — within a deadline;
only events still queued at the deadline are lost, and counted in the log. A process killed
with SIGKILL loses what it had not flushed (at most one flush interval of events; never a
payment: events are an audit log, the key and transaction rows are the record). A full queue
drops new events and counts them in ``idempay_events_dropped_total``.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import deque
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

import structlog
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncEngine

from api.db import atomic
from api.metrics import EVENTS_DROPPED
from api.models import RequestEvent

log = structlog.get_logger("idempay.events")
SHUTDOWN_DRAIN_SECONDS = 10.0
DRAIN_RETRY_SECONDS = 0.05  # first pause after a failed flush while draining


class RequestOutcome(StrEnum):
    """A request event's ``outcome`` (contract §5); the values are in the database and the lake."""

    CREATED = "created"  # create
    REPLAYED = "replayed"
    IN_PROGRESS = "in_progress"  # create, abort
    KEY_REUSED = "key_reused"
    ABORTED = "aborted"  # create, abort
    EXPIRED = "expired"
    REJECTED = "rejected"  # create, reversal
    ERROR = "error"
    FOUND = "found"  # lookup
    PROCESSING = "processing"
    NOT_FOUND = "not_found"
    FENCED = "fenced"
    ALREADY_PROCESSED = "already_processed"  # abort
    REVERSED = "reversed"  # reversal
    ALREADY_REVERSED = "already_reversed"
    NOT_RECORDED = ""  # no request event: a lookup or abort refused before it named a key


@dataclass(frozen=True, slots=True)
class Event:
    ts: datetime
    merchant_id: str
    terminal_id: str | None
    idempotency_key: str | None
    endpoint: str
    outcome: RequestOutcome
    http_status: int
    attempt: int | None
    network: str | None
    latency_ms: float
    event_id: str | None = None  # None: minted by the writer when a flush first takes it


COLUMNS = (
    "event_id", "ts", "merchant_id", "terminal_id", "idempotency_key", "endpoint", "outcome",
    "http_status", "attempt", "network", "latency_ms",
)  # fmt: skip
Row = tuple[Any, ...]  # one value per column of COLUMNS

# One statement per batch on Postgres: a column per array, ids decided before the first try.
PG_INSERT = """INSERT INTO request_event (event_id, ts, merchant_id, terminal_id,
  idempotency_key, endpoint, outcome, http_status, attempt, network, latency_ms)
SELECT * FROM unnest($1::varchar[], $2::timestamptz[], $3::varchar[], $4::varchar[],
  $5::varchar[], $6::varchar[], $7::varchar[], $8::int[], $9::int[], $10::varchar[],
  $11::float8[])
ON CONFLICT (merchant_id, event_id) DO NOTHING
"""


# Citus: a merchant's rows, at most CITUS_CHUNK per statement, in power-of-two chunks.
CITUS_CHUNK = 64
_MERCHANT = COLUMNS.index("merchant_id")


def citus_insert(rows: int) -> str:
    """``INSERT … VALUES`` of ``rows`` rows: one merchant's, so one shard on Citus."""
    width = len(COLUMNS)
    values = ", ".join(
        "(" + ", ".join(f"${row * width + column + 1}" for column in range(width)) + ")"
        for row in range(rows)
    )
    return (
        f"INSERT INTO request_event ({', '.join(COLUMNS)}) VALUES {values} "
        "ON CONFLICT (merchant_id, event_id) DO NOTHING"
    )


CITUS_INSERTS = {size: citus_insert(size) for size in (1, 2, 4, 8, 16, 32, CITUS_CHUNK)}


def by_merchant(rows: list[Row]) -> list[list[Row]]:
    """The Citus statements' rows: each merchant's rows in chunks of 64, 32, …, 1."""
    merchants: dict[str, list[Row]] = {}
    for row in rows:
        merchants.setdefault(row[_MERCHANT], []).append(row)
    chunks: list[list[Row]] = []
    for own in merchants.values():
        start = 0
        while start < len(own):
            size = CITUS_CHUNK
            while size > len(own) - start:
                size //= 2
            chunks.append(own[start : start + size])
            start += size
    return chunks


def _row(item: Event | Row) -> Row:
    """The row of a queued event; a row put back by a failed flush is already one."""
    if not isinstance(item, Event):
        return item
    return (
        item.event_id or str(uuid.uuid4()),
        item.ts,
        item.merchant_id,
        item.terminal_id,
        item.idempotency_key,
        item.endpoint,
        str(item.outcome),
        item.http_status,
        item.attempt,
        item.network,
        item.latency_ms,
    )


def _insert_once(dialect: str) -> Any:
    module = postgresql if dialect == "postgresql" else sqlite
    return module.insert(RequestEvent).on_conflict_do_nothing(
        index_elements=["merchant_id", "event_id"]
    )


@runtime_checkable
class SqliteBatches(Protocol):
    """The embedded SQLite's writer thread (``api.transactions.sqlite_create.SqliteInline``):
    takes a flush's rows into its next batch and returns after that batch's COMMIT."""

    async def write_events(self, rows: list[Row]) -> None: ...


class EventWriter:
    """``citus``: the database has Citus (the app's start-up probe, ``api.main``): each
    merchant's rows are written by statements of their own (``_insert_by_merchant``).
    ``sqlite``: on the embedded SQLite, the creates' writer thread, whose batches carry the
    flushes (one transaction and one fsync with the creates queued beside them, instead of a
    ``BEGIN IMMEDIATE`` of the flush's own that creates would queue behind)."""

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        citus: bool,
        batch_size: int,
        interval: float,
        max_queue: int,
        sqlite: SqliteBatches | None = None,
    ) -> None:
        self._engine = engine
        self._batch_size = batch_size
        self._interval = interval
        self._max_queue = max_queue
        self._queue: deque[Event | Row] = deque()
        self._postgres = engine.dialect.name == "postgresql"
        if citus and not self._postgres:
            raise ValueError("Citus is a Postgres extension")
        self._citus = citus
        if sqlite is not None and self._postgres:
            raise ValueError("the SQLite writer thread writes SQLite only")
        self._sqlite = sqlite
        self._insert = _insert_once(engine.dialect.name)
        self._closing = asyncio.Event()

    def record(self, event: Event | Row) -> None:
        """Queue one event (the request path's only cost); a full queue drops it, counted."""
        if len(self._queue) >= self._max_queue:
            EVENTS_DROPPED.inc()
            return
        self._queue.append(event)

    async def flush(self) -> int:
        queue = self._queue
        taken = min(self._batch_size, len(queue))
        if not taken:
            return 0
        rows = [_row(queue.popleft()) for _ in range(taken)]
        if self._citus:
            return await self._insert_by_merchant(rows)
        try:
            await (self._insert_pg(rows) if self._postgres else self._insert_rows(rows))
        except Exception as exc:  # storage down: put them back, try on the next tick
            log.warning("event_flush_failed", error=type(exc).__name__, events=len(rows))
            self._put_back(rows)
            return 0
        except BaseException:  # cancelled mid-INSERT: the batch goes back, same ids
            self._put_back(rows)
            raise
        return len(rows)

    async def _insert_pg(self, rows: list[Row]) -> None:
        pooled = await self._engine.raw_connection()
        try:
            driver: Any = pooled.driver_connection
            async with driver.transaction():  # BEGIN, the INSERT, COMMIT: per batch, not event
                await driver.execute(PG_INSERT, *zip(*rows, strict=True))
        except BaseException as exc:  # never hand a failed or cut-short connection out again
            pooled.invalidate(exc if isinstance(exc, Exception) else None)
            raise
        finally:
            pooled.close()

    async def _insert_by_merchant(self, rows: list[Row]) -> int:
        """Citus: each merchant's rows in statements of their own, each its own transaction
        routed to the merchant's shard. A merchant whose statement fails (its worker down)
        gets its rows put back, the others' land; a connection lost puts back everything
        not written yet. Returns how many rows were written."""
        try:
            pooled = await self._engine.raw_connection()
        except Exception as exc:  # no connection: nothing written, everything back
            log.warning("event_flush_failed", error=type(exc).__name__, events=len(rows))
            self._put_back(rows)
            return 0
        except BaseException:
            self._put_back(rows)
            raise
        chunks = by_merchant(rows)
        position = written = 0  # chunks before `position` are written or in `failed`
        failed: list[Row] = []
        refused: set[str] = set()  # merchants whose statement failed in this flush
        error: Exception | None = None
        try:
            driver: Any = pooled.driver_connection
            while position < len(chunks):
                chunk = chunks[position]
                merchant = chunk[0][_MERCHANT]
                if merchant not in refused:
                    try:
                        args = [value for row in chunk for value in row]
                        await driver.execute(CITUS_INSERTS[len(chunk)], *args)
                    except Exception as exc:  # its worker is down, or the coordinator is
                        error = exc
                        refused.add(merchant)
                        if driver.is_closed():  # the connection is gone: the rest goes back
                            break
                    else:
                        written += len(chunk)
                        position += 1
                        continue
                failed.extend(chunk)
                position += 1
        except BaseException as exc:  # cancelled mid-statement: this chunk and the rest back
            self._put_back(failed + [row for chunk in chunks[position:] for row in chunk])
            pooled.invalidate(exc if isinstance(exc, Exception) else None)
            pooled.close()
            raise
        failed.extend(row for chunk in chunks[position:] for row in chunk)
        if error is not None:
            log.warning(
                "event_flush_failed",
                error=type(error).__name__,
                events=len(failed),
                merchants=len(refused),
            )
            self._put_back(failed)
            if driver.is_closed():
                pooled.invalidate(error)
        pooled.close()
        return written

    async def _insert_rows(self, rows: list[Row]) -> None:
        if self._sqlite is not None:
            await self._sqlite.write_events(rows)
            return
        async with atomic(self._engine) as conn:
            await conn.execute(self._insert, [dict(zip(COLUMNS, row, strict=True)) for row in rows])

    def _put_back(self, rows: list[Row]) -> None:
        for row in rows:
            self.record(row)

    async def run_forever(self) -> None:
        """Flush every ``interval`` until ``close``; then drain what is queued."""
        while not self._closing.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), self._interval)
            while await self.flush() == self._batch_size:
                pass
        await self.drain()

    async def drain(self) -> None:
        """Flush until the queue is empty. A flush that fails (storage restarting while
        the process shuts down) is retried after a pause instead of giving the queue up:
        ``close`` bounds the whole drain by its deadline."""
        pause = DRAIN_RETRY_SECONDS
        while self._queue:
            if await self.flush() == 0:
                await asyncio.sleep(pause)
                pause = min(pause * 2, 1.0)
            else:
                pause = DRAIN_RETRY_SECONDS

    async def close(
        self, runner: asyncio.Task[None], *, deadline: float = SHUTDOWN_DRAIN_SECONDS
    ) -> int:
        """Stop ``runner`` (the ``run_forever`` task) without cutting a flush short: it
        finishes the flush under way and drains the queue, for at most ``deadline``
        seconds. Returns how many events were left unwritten."""
        self._closing.set()
        try:
            await asyncio.wait_for(asyncio.shield(runner), deadline)
        except TimeoutError:
            runner.cancel()
        except Exception as exc:  # the runner died: still report what is left
            log.warning("event_writer_failed", error=type(exc).__name__)
        await asyncio.gather(runner, return_exceptions=True)
        left = len(self._queue)
        if left:
            log.warning("events_lost_at_shutdown", events=left, deadline_s=deadline)
        return left
