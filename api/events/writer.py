"""Request events (SPEC §5): one per request, appended through a bounded in-memory queue
and flushed in batches by a background task, so the request path never waits on them.

A process killed with SIGKILL loses at most one flush interval of events (never a payment:
events are an audit log, the key and transaction rows are the record). A full queue drops
new events and counts them in ``idempay_events_dropped_total``.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import asdict, dataclass
from datetime import datetime

import structlog
from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncEngine

from api.db import atomic
from api.metrics import EVENTS_DROPPED
from api.models import RequestEvent

log = structlog.get_logger("idempay.events")


@dataclass(frozen=True, slots=True)
class Event:
    ts: datetime
    merchant_id: str
    terminal_id: str | None
    idempotency_key: str | None
    endpoint: str
    outcome: str
    http_status: int
    attempt: int | None
    network: str | None
    latency_ms: float


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
        rows = [{"event_id": str(uuid.uuid4()), **asdict(event)} for event in batch]
        try:
            async with atomic(self._engine) as conn:
                await conn.execute(insert(RequestEvent), rows)
        except Exception as exc:  # storage down: put them back, try on the next tick
            log.warning("event_flush_failed", error=type(exc).__name__, events=len(rows))
            for event in batch:
                self.record(event)
            return 0
        return len(rows)

    async def run_forever(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            while await self.flush() == self._batch_size:
                pass

    async def drain(self) -> None:
        while not self._queue.empty():
            if await self.flush() == 0:
                return
