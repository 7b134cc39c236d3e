"""The delivery queue: one ``webhook_delivery`` row per (endpoint, outbox event).

fan-out  each active endpoint queues its merchant's events numbered after its
         ``enqueued_seq`` (the outbox's per-merchant ``seq``), and moves the mark, in one
         transaction;
head     an endpoint's next delivery is its pending row with the lowest ``seq``: nothing
         newer is sent while it waits (ordered per merchant, head-of-line by design);
attempt  2xx → delivered; anything else → retried after an exponential backoff, and once
         the first failure is older than ``give_up_after`` (3 days) → dead (the
         dead-letter list), and the queue moves on.
Every write is guarded on the row still being pending, so a stale worker changes nothing.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from api.db import atomic
from api.models import OutboxEvent, WebhookDelivery, WebhookEndpoint

THREE_DAYS = 3 * 86_400.0


@dataclass(frozen=True, slots=True)
class Backoff:
    """Delay before retry n (1-based): ``base·2^(n-1)`` capped at ``cap``, with jitter
    (half to all of it); ``give_up_after`` seconds after the first failure, dead."""

    base: float = 30.0
    cap: float = 6 * 3600.0
    give_up_after: float = THREE_DAYS

    def delay(self, attempts: int) -> float:
        full = min(self.cap, self.base * 2.0 ** min(attempts - 1, 30))
        return full * random.uniform(0.5, 1.0)  # noqa: S311 - jitter, not a secret


@dataclass(frozen=True, slots=True)
class Target:
    id: str
    merchant_id: str
    url: str
    secret: str
    enqueued_seq: int


@dataclass(frozen=True, slots=True)
class Delivery:
    endpoint_id: str
    event_id: str
    seq: int
    attempts: int
    next_attempt_at: datetime
    first_failed_at: datetime | None
    payload: str | None  # None: the outbox row was purged


async def active_targets(engine: AsyncEngine) -> list[Target]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            select(
                WebhookEndpoint.id,
                WebhookEndpoint.merchant_id,
                WebhookEndpoint.url,
                WebhookEndpoint.secret,
                WebhookEndpoint.enqueued_seq,
            ).where(WebhookEndpoint.removed_at.is_(None))
        )
        return [Target(*row) for row in rows.all()]


async def fan_out(engine: AsyncEngine, target: Target, *, batch: int, now: datetime) -> int:
    async with atomic(engine) as conn:
        events = (
            await conn.execute(
                select(OutboxEvent.event_id, OutboxEvent.seq)
                .where(
                    OutboxEvent.merchant_id == target.merchant_id,
                    OutboxEvent.seq > target.enqueued_seq,
                )
                .order_by(OutboxEvent.seq)
                .limit(batch)
            )
        ).all()
        if not events:
            return 0
        moved = await conn.execute(
            update(WebhookEndpoint)
            .where(
                WebhookEndpoint.id == target.id,
                WebhookEndpoint.enqueued_seq == target.enqueued_seq,
            )
            .values(enqueued_seq=events[-1].seq)
        )
        if not moved.rowcount:  # another worker queued them
            return 0
        await conn.execute(
            insert(WebhookDelivery),
            [
                {
                    "endpoint_id": target.id,
                    "event_id": row.event_id,
                    "seq": row.seq,
                    "attempts": 0,
                    "next_attempt_at": now,
                }
                for row in events
            ],
        )
    return len(events)


async def head(engine: AsyncEngine, endpoint_id: str) -> Delivery | None:
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                select(
                    WebhookDelivery.endpoint_id,
                    WebhookDelivery.event_id,
                    WebhookDelivery.seq,
                    WebhookDelivery.attempts,
                    WebhookDelivery.next_attempt_at,
                    WebhookDelivery.first_failed_at,
                    OutboxEvent.payload,
                )
                .outerjoin(OutboxEvent, OutboxEvent.event_id == WebhookDelivery.event_id)
                .where(
                    WebhookDelivery.endpoint_id == endpoint_id,
                    WebhookDelivery.delivered_at.is_(None),
                    WebhookDelivery.dead_at.is_(None),
                )
                .order_by(WebhookDelivery.seq)
                .limit(1)
            )
        ).first()
    return Delivery(*row) if row else None


def _outcome(
    delivery: Delivery, error: str | None, *, now: datetime, backoff: Backoff
) -> dict[str, Any]:
    attempts = delivery.attempts + 1
    if error is None:
        return {"attempts": attempts, "delivered_at": now, "last_error": None}
    first = delivery.first_failed_at or now
    values: dict[str, Any] = {"attempts": attempts, "first_failed_at": first, "last_error": error}
    if delivery.payload is None or (now - first).total_seconds() >= backoff.give_up_after:
        values["dead_at"] = now
    else:
        values["next_attempt_at"] = now + timedelta(seconds=backoff.delay(attempts))
    return values


async def record(
    engine: AsyncEngine, delivery: Delivery, error: str | None, *, now: datetime, backoff: Backoff
) -> None:
    """The attempt's outcome: ``error`` None for a 2xx, else what went wrong."""
    async with atomic(engine) as conn:
        await conn.execute(
            update(WebhookDelivery)
            .where(
                WebhookDelivery.endpoint_id == delivery.endpoint_id,
                WebhookDelivery.event_id == delivery.event_id,
                WebhookDelivery.attempts == delivery.attempts,
                WebhookDelivery.delivered_at.is_(None),
                WebhookDelivery.dead_at.is_(None),
            )
            .values(**_outcome(delivery, error, now=now, backoff=backoff))
        )
