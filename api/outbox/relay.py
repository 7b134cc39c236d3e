"""``idempay relay``: publish outbox events to a Redis Stream, at least once, in order per
merchant.

One batch: read unsent events ordered by (merchant, seq) → XADD them in one pipeline →
mark them sent. A relay killed between the XADD and the mark publishes that batch again
after restart: consumers dedupe by ``event_id`` (``consume`` below is the reference).
On Postgres only one relay publishes at a time (a session advisory lock), so two relays
can never interleave a merchant's events; a second relay waits as a hot standby.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import structlog
from sqlalchemy import select, text, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from api.db import atomic, utcnow
from api.metrics import OUTBOX_PUBLISHED
from api.models import OutboxEvent

log = structlog.get_logger("idempay.relay")
LOCK_ID = 0x1DE4_9A7  # pg advisory lock id for "the relay"
STREAM_TTL_SECONDS = 7 * 86_400
STREAM_MAXLEN = 1_000_000


class Relay:
    def __init__(
        self,
        engine: AsyncEngine,
        redis: Any,
        *,
        stream: str,
        batch: int = 500,
        mark_delay: float = 0.0,
    ) -> None:
        self.engine = engine
        self.redis = redis
        self.stream = stream
        self.batch = batch
        self.mark_delay = mark_delay  # fault-injection knob for tests: widen the kill window

    async def run_once(self) -> int:
        async with self.engine.connect() as conn:
            rows = (
                await conn.execute(
                    select(OutboxEvent.id, OutboxEvent.event_id, OutboxEvent.payload)
                    .where(OutboxEvent.sent_at.is_(None))
                    .order_by(OutboxEvent.merchant_id, OutboxEvent.seq)
                    .limit(self.batch)
                )
            ).all()
        if not rows:
            return 0
        pipe = self.redis.pipeline(transaction=False)
        for row in rows:
            pipe.xadd(
                self.stream,
                {"event_id": row.event_id, "payload": row.payload},
                maxlen=STREAM_MAXLEN,
                approximate=True,
            )
        pipe.expire(self.stream, STREAM_TTL_SECONDS)
        await pipe.execute()
        if self.mark_delay:
            await asyncio.sleep(self.mark_delay)
        async with atomic(self.engine) as conn:
            await conn.execute(
                update(OutboxEvent)
                .where(OutboxEvent.id.in_([row.id for row in rows]))
                .values(sent_at=utcnow())
            )
        OUTBOX_PUBLISHED.inc(len(rows))
        return len(rows)

    async def run_forever(
        self, *, interval: float = 0.2, stop: Callable[[], bool] = lambda: False
    ) -> None:
        async with self.engine.connect() as lock_conn:
            await _lead(lock_conn)
            while not stop():
                try:
                    published = await self.run_once()
                except Exception as exc:  # Redis or storage down: retry next tick
                    log.warning("relay_tick_failed", error=type(exc).__name__)
                    published = 0
                if published < self.batch:
                    await asyncio.sleep(interval)


async def _lead(conn: AsyncConnection) -> None:
    """Block until this relay holds the leadership lock (Postgres); no-op on SQLite."""
    if conn.dialect.name != "postgresql":
        return
    while True:
        if (await conn.execute(text(f"SELECT pg_try_advisory_lock({LOCK_ID})"))).scalar():
            break
        await asyncio.sleep(1.0)
    await conn.commit()  # keep the session lock, end the transaction
    log.info("relay_leading")


def consume(
    entries: list[tuple[bytes, dict[bytes, bytes]]], seen: set[str]
) -> list[dict[str, Any]]:
    """Reference consumer step: decode stream entries, drop duplicates by event_id."""
    import json

    fresh = []
    for _entry_id, fields in entries:
        event_id = fields[b"event_id"].decode()
        if event_id in seen:
            continue
        seen.add(event_id)
        fresh.append(json.loads(fields[b"payload"]))
    return fresh
