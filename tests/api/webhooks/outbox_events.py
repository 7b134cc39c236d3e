"""Outbox events for a merchant, appended as the create path appends them."""

from __future__ import annotations

import uuid

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from api.db import atomic, utcnow
from api.outbox import writer as outbox


async def merchant_id(engine: AsyncEngine, name: str) -> str:
    async with engine.connect() as conn:
        row = await conn.execute(text("SELECT id FROM merchant WHERE name = :n"), {"n": name})
        return str(row.scalar_one())


async def append(engine: AsyncEngine, merchant: str, count: int) -> list[str]:
    """Append ``count`` events for the merchant named ``merchant``, each in its own commit;
    their transaction ids."""
    owner = await merchant_id(engine, merchant)
    ids = []
    for _ in range(count):
        key = str(uuid.uuid4())
        async with atomic(engine) as conn:
            await outbox.append(
                conn,
                merchant_id=owner,
                event_type=outbox.COMPLETED,
                transaction_id=key,
                data={"id": key, "status": "approved"},
                now=utcnow(),
            )
        ids.append(key)
    return ids
