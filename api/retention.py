"""Retention (contract §3.5, README "Retention policy").

Processed keys live as long as their transactions (forever). Tombstones (``aborted``,
``expired``) are deleted after ``IDEMPAY_TOMBSTONE_RETENTION`` +
``IDEMPAY_CLOCK_SKEW_TOLERANCE``; request events after the retention, and only once exported
to the lake; webhook deliveries the retention after they were delivered or dead-lettered.
Creates older than the retention are refused (``captured_at``, or the mint time of a UUIDv7
key), and so are times further ahead of the server's clock than the
tolerance (422 ``clock_skew``): no late original can outlive its tombstone, not even from a
terminal whose clock runs ahead. Purges run in bounded batches so they never hold long locks.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, or_, select, tuple_
from sqlalchemy.ext.asyncio import AsyncEngine

from api.db import atomic, utcnow
from api.idempotency.store import ABORTED, EXPIRED
from api.metrics import PURGED
from api.models import IdempotencyKey, OutboxEvent, RequestEvent, WebhookDelivery

BATCH = 5_000


@dataclass(frozen=True, slots=True)
class PurgeReport:
    tombstones: int
    request_events: int
    outbox_events: int
    webhook_deliveries: int = 0


async def purge(
    engine: AsyncEngine,
    *,
    retention_seconds: float,
    tolerance_seconds: float,
    now: datetime | None = None,
) -> PurgeReport:
    """Tombstones go at retention + clock-skew tolerance, events and the outbox at retention."""
    cutoff = (now or utcnow()) - timedelta(seconds=retention_seconds)
    tombstones = await _purge_keys(engine, cutoff - timedelta(seconds=tolerance_seconds))
    events = await _purge_events(engine, cutoff)
    outbox = await _purge_outbox(engine, cutoff)
    deliveries = await _purge_webhook_deliveries(engine, cutoff)
    PURGED.labels("idempotency_key").inc(tombstones)
    PURGED.labels("request_event").inc(events)
    PURGED.labels("outbox_event").inc(outbox)
    PURGED.labels("webhook_delivery").inc(deliveries)
    return PurgeReport(tombstones, events, outbox, deliveries)


async def _purge_keys(engine: AsyncEngine, cutoff: datetime) -> int:
    total = 0
    while True:
        async with atomic(engine) as conn:
            rows = (
                await conn.execute(
                    select(IdempotencyKey.merchant_id, IdempotencyKey.key)
                    .where(
                        IdempotencyKey.state.in_((ABORTED, EXPIRED)),
                        IdempotencyKey.updated_at < cutoff,
                    )
                    .limit(BATCH)
                )
            ).all()
            if rows:
                pairs = [(row.merchant_id, row.key) for row in rows]
                await conn.execute(
                    delete(IdempotencyKey).where(
                        tuple_(IdempotencyKey.merchant_id, IdempotencyKey.key).in_(pairs),
                        IdempotencyKey.state.in_((ABORTED, EXPIRED)),
                    )
                )
        total += len(rows)
        if len(rows) < BATCH:
            return total


async def _purge_events(engine: AsyncEngine, cutoff: datetime) -> int:
    total = 0
    while True:
        async with atomic(engine) as conn:
            ids = (
                (
                    await conn.execute(
                        select(RequestEvent.event_id)
                        .where(RequestEvent.ts < cutoff, RequestEvent.exported_at.is_not(None))
                        .limit(BATCH)
                    )
                )
                .scalars()
                .all()
            )
            if ids:
                await conn.execute(delete(RequestEvent).where(RequestEvent.event_id.in_(ids)))
        total += len(ids)
        if len(ids) < BATCH:
            return total


async def _purge_outbox(engine: AsyncEngine, cutoff: datetime) -> int:
    async with atomic(engine) as conn:
        result = await conn.execute(
            delete(OutboxEvent).where(
                OutboxEvent.sent_at.is_not(None), OutboxEvent.sent_at < cutoff
            )
        )
    return int(result.rowcount)


async def _purge_webhook_deliveries(engine: AsyncEngine, cutoff: datetime) -> int:
    """Delivered and dead-lettered deliveries, the retention after they ended; pending ones
    stay (a delivery dead-letters after 3 days of failures)."""
    async with atomic(engine) as conn:
        result = await conn.execute(
            delete(WebhookDelivery).where(
                or_(WebhookDelivery.delivered_at < cutoff, WebhookDelivery.dead_at < cutoff)
            )
        )
    return int(result.rowcount)
