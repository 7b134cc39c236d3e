"""A merchant's webhook endpoints (``idempay admin webhook …``): add, list, remove, the
dead-letter list and replay of a time range."""

from __future__ import annotations

import secrets
import uuid
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import urlsplit

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from api.db import atomic, utcnow
from api.models import (
    Merchant,
    MerchantOutboxSeq,
    OutboxEvent,
    WebhookDelivery,
    WebhookEndpoint,
)
from api.webhooks import destinations
from api.webhooks.destinations import AllowList, Resolver


class UnknownEndpointError(LookupError):
    """No active endpoint has this id."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    id: str
    merchant: str
    url: str
    created_at: datetime


@dataclass(frozen=True, slots=True)
class DeadLetter:
    endpoint_id: str
    event_id: str
    seq: int
    attempts: int
    last_error: str | None
    dead_at: datetime | None


def check_url(url: str) -> str:
    """An absolute http(s) URL, or ValueError."""
    parts = urlsplit(url)
    try:
        parts.port  # noqa: B018 - raises on a port that is not one
    except ValueError:
        raise ValueError(f"expected an http(s) URL, got {url!r}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"expected an http(s) URL, got {url!r}")
    return url


async def check_destination(
    url: str, allow: AllowList | None = None, resolver: Resolver | None = None
) -> None:
    """Refuse (RefusedDestinationError, a ValueError) a URL whose host is, or resolves to, an
    address webhooks may not go to (``destinations``); ``allow`` defaults to the settings."""
    parts = urlsplit(check_url(url))
    host = (parts.hostname or "").rstrip(".")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    allow = allow if allow is not None else AllowList.from_settings()
    await destinations.check_at_add(host, port, allow, resolver or destinations.system_resolver)


async def add(
    engine: AsyncEngine,
    merchant: str,
    url: str,
    *,
    secret: str | None = None,
    allow: AllowList | None = None,
    resolver: Resolver | None = None,
) -> tuple[Endpoint, str]:
    """Register ``url`` for the merchant named ``merchant``: it receives the events numbered
    from now on (``replay`` sends older ones). Returns the endpoint and its signing secret.
    A destination not allowed (``check_destination``) is refused with a ValueError."""
    await check_destination(url, allow, resolver)
    secret = secret or "whsec_" + secrets.token_urlsafe(32)
    now = utcnow()
    async with atomic(engine) as conn:
        merchant_id = (
            await conn.execute(select(Merchant.id).where(Merchant.name == merchant))
        ).scalar_one_or_none()
        if merchant_id is None:
            raise LookupError(f"no merchant named {merchant!r}")
        last = (
            await conn.execute(
                select(MerchantOutboxSeq.seq).where(MerchantOutboxSeq.merchant_id == merchant_id)
            )
        ).scalar_one_or_none()
        endpoint = Endpoint("whe_" + uuid.uuid4().hex[:20], merchant, url, now)
        await conn.execute(
            insert(WebhookEndpoint).values(
                id=endpoint.id,
                merchant_id=merchant_id,
                url=url,
                secret=secret,
                enqueued_seq=last or 0,
                created_at=now,
            )
        )
    return endpoint, secret


async def list_endpoints(engine: AsyncEngine, merchant: str | None = None) -> list[Endpoint]:
    query = (
        select(WebhookEndpoint.id, Merchant.name, WebhookEndpoint.url, WebhookEndpoint.created_at)
        .join(Merchant, Merchant.id == WebhookEndpoint.merchant_id)
        .where(WebhookEndpoint.removed_at.is_(None))
        .order_by(Merchant.name, WebhookEndpoint.created_at)
    )
    if merchant is not None:
        query = query.where(Merchant.name == merchant)
    async with engine.connect() as conn:
        return [Endpoint(*row) for row in (await conn.execute(query)).all()]


async def remove(engine: AsyncEngine, endpoint_id: str) -> None:
    """Stop delivering to the endpoint (its queue and dead letters are kept)."""
    async with atomic(engine) as conn:
        result = await conn.execute(
            update(WebhookEndpoint)
            .where(WebhookEndpoint.id == endpoint_id, WebhookEndpoint.removed_at.is_(None))
            .values(removed_at=utcnow())
        )
    if not result.rowcount:
        raise UnknownEndpointError(endpoint_id)


async def dead_letters(engine: AsyncEngine, merchant: str | None = None) -> list[DeadLetter]:
    query = (
        select(
            WebhookDelivery.endpoint_id,
            WebhookDelivery.event_id,
            WebhookDelivery.seq,
            WebhookDelivery.attempts,
            WebhookDelivery.last_error,
            WebhookDelivery.dead_at,
        )
        .join(WebhookEndpoint, WebhookEndpoint.id == WebhookDelivery.endpoint_id)
        .join(Merchant, Merchant.id == WebhookEndpoint.merchant_id)
        .where(WebhookDelivery.dead_at.is_not(None))
        .order_by(WebhookDelivery.endpoint_id, WebhookDelivery.seq)
    )
    if merchant is not None:
        query = query.where(Merchant.name == merchant)
    async with engine.connect() as conn:
        return [DeadLetter(*row) for row in (await conn.execute(query)).all()]


async def replay(engine: AsyncEngine, endpoint_id: str, start: datetime, end: datetime) -> int:
    """Queue again every event of the endpoint's merchant that occurred in [start, end) —
    delivered, dead, or from before the endpoint existed — with the same event ids
    (receivers dedupe); events not queued yet are left to the fan-out. The queue sends its
    lowest ``seq`` first, so replayed events go out in order, before newer pending ones."""
    now = utcnow()
    async with atomic(engine) as conn:
        endpoint = (
            await conn.execute(
                select(WebhookEndpoint.merchant_id, WebhookEndpoint.enqueued_seq).where(
                    WebhookEndpoint.id == endpoint_id, WebhookEndpoint.removed_at.is_(None)
                )
            )
        ).first()
        if endpoint is None:
            raise UnknownEndpointError(endpoint_id)
        events = (
            await conn.execute(
                select(OutboxEvent.event_id, OutboxEvent.seq).where(
                    OutboxEvent.merchant_id == endpoint.merchant_id,
                    OutboxEvent.seq <= endpoint.enqueued_seq,  # later ones: queued by fan-out
                    OutboxEvent.created_at >= start,
                    OutboxEvent.created_at < end,
                )
            )
        ).all()
        ids = [row.event_id for row in events]
        if ids:
            await conn.execute(
                delete(WebhookDelivery).where(
                    WebhookDelivery.endpoint_id == endpoint_id, WebhookDelivery.event_id.in_(ids)
                )
            )
            await conn.execute(
                insert(WebhookDelivery),
                [
                    {
                        "endpoint_id": endpoint_id,
                        "event_id": row.event_id,
                        "seq": row.seq,
                        "attempts": 0,
                        "next_attempt_at": now,
                    }
                    for row in events
                ],
            )
    return len(ids)


async def pending(engine: AsyncEngine, endpoint_id: str) -> int:
    """Deliveries still to make to the endpoint."""
    async with engine.connect() as conn:
        return int(
            (
                await conn.execute(
                    select(func.count()).where(
                        WebhookDelivery.endpoint_id == endpoint_id,
                        WebhookDelivery.delivered_at.is_(None),
                        WebhookDelivery.dead_at.is_(None),
                    )
                )
            ).scalar_one()
        )
