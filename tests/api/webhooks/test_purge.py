"""Retention purges webhook deliveries the retention after they were delivered or
dead-lettered; pending ones stay, however old."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import insert, select

from api.auth import create_api_key
from api.db import atomic, create_engine, utcnow
from api.models import WebhookDelivery
from api.retention import purge
from api.webhooks import endpoints
from api.webhooks.destinations import AllowList
from tests.support.backend import Backend


async def test_ended_deliveries_go_after_the_retention(private_backend: Backend) -> None:
    engine = create_engine(private_backend.settings)
    try:
        await create_api_key(engine, "merchant-purge")
        endpoint, _ = await endpoints.add(
            engine, "merchant-purge", "http://127.0.0.1:9/", allow=AllowList.parse("127.0.0.1/32")
        )
        now = utcnow()
        old = now - timedelta(days=40)
        rows = {
            "delivered-old": {"delivered_at": old},
            "dead-old": {"dead_at": old},
            "delivered-new": {"delivered_at": now},
            "pending-old": {},
        }
        async with atomic(engine) as conn:
            for seq, (event_id, ended) in enumerate(rows.items(), start=1):
                values = {"attempts": 1, "next_attempt_at": old, **ended}
                await conn.execute(
                    insert(WebhookDelivery).values(
                        endpoint_id=endpoint.id, event_id=event_id, seq=seq, **values
                    )
                )
        report = await purge(engine, retention_seconds=35 * 86_400, tolerance_seconds=300)
        assert report.webhook_deliveries == 2
        async with engine.connect() as conn:
            kept = (await conn.execute(select(WebhookDelivery.event_id))).scalars().all()
        assert sorted(kept) == ["delivered-new", "pending-old"]
    finally:
        await engine.dispose()
