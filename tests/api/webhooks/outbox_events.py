"""Outbox events for a merchant, appended as the create path appends them, on an engine
with the merchants a test names."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from api.auth import create_api_key
from api.db import atomic, create_engine, utcnow
from api.outbox import writer as outbox
from tests.support.backend import Backend


@asynccontextmanager
async def merchants_engine(backend: Backend, *names: str) -> AsyncIterator[AsyncEngine]:
    """An engine on the backend's database, a merchant (with an API key) of each name made
    first; disposed at the exit."""
    engine = create_engine(backend.settings)
    try:
        for name in names:
            await create_api_key(engine, name)
        yield engine
    finally:
        await engine.dispose()


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
