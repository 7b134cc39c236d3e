"""Request events (contract §5): one per request, appended through a bounded in-memory queue
and flushed in batches by a background task, so the request path never waits on them.

Each event gets its ``event_id`` when it is recorded, and the flush inserts with
``ON CONFLICT (event_id) DO NOTHING``: a batch retried after an error — even one whose
COMMIT succeeded and whose reply was lost — lands once. A flush that fails or is
cancelled puts its batch back on the queue.

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
from dataclasses import asdict, dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

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


def _new_event_id() -> str:
    return str(uuid.uuid4())


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
    event_id: str = field(default_factory=_new_event_id)  # minted once, when recorded


def _insert_once(dialect: str) -> Any:
    module = postgresql if dialect == "postgresql" else sqlite
    return module.insert(RequestEvent).on_conflict_do_nothing(index_elements=["event_id"])


class EventWriter:
    def __init__(
        self,
        engine: AsyncEngine,
        *,
        batch_size: int,
        interval: float,
        max_queue: int,
    ) -> None:
        self._engine = engine
        self._batch_size = batch_size
        self._interval = interval
        self._queue: asyncio.Queue[Event] = asyncio.Queue(maxsize=max_queue)
        self._insert = _insert_once(engine.dialect.name)
        self._closing = asyncio.Event()

    def record(self, event: Event) -> None:
        try:
            self._queue.put_nowait(event)
        except asyncio.QueueFull:
            EVENTS_DROPPED.inc()

    async def flush(self) -> int:
        batch: list[Event] = []
        while len(batch) < self._batch_size and not self._queue.empty():
            batch.append(self._queue.get_nowait())
        if not batch:
            return 0
        rows = [asdict(event) for event in batch]
        try:
            async with atomic(self._engine) as conn:
                await conn.execute(self._insert, rows)
        except Exception as exc:  # storage down: put them back, try on the next tick
            log.warning("event_flush_failed", error=type(exc).__name__, events=len(rows))
            self._put_back(batch)
            return 0
        except BaseException:  # cancelled mid-INSERT: the batch goes back, same ids
            self._put_back(batch)
            raise
        return len(rows)

    def _put_back(self, batch: list[Event]) -> None:
        for event in batch:
            self.record(event)

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
        while not self._queue.empty():
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
        left = self._queue.qsize()
        if left:
            log.warning("events_lost_at_shutdown", events=left, deadline_s=deadline)
        return left
