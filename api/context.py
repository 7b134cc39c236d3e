"""What the routes need, built once per process in the app's lifespan."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from api.acquirer.runtime import AcquirerRuntime
from api.auth import Authenticator
from api.config import Settings
from api.events.writer import EventWriter
from api.idempotency.waiters import Waiters
from api.ratelimit import RateLimiter
from api.transactions.service import TransactionService


@dataclass
class AppContext:
    settings: Settings
    engine: AsyncEngine
    citus: bool  # the database has Citus: probed once by build_context (api/main.py)
    service: TransactionService
    auth: Authenticator
    limiter: RateLimiter
    events: EventWriter
    waiters: Waiters
    acquirer: AcquirerRuntime
    redis: Any | None = None

    async def close(self) -> None:
        """Close what ``build_context`` opened: Redis, the hot path's connections, the
        acquirer link (or its child host), the engine."""
        if self.redis is not None:
            await self.redis.aclose()
        if self.service.inline is not None:
            await self.service.inline.close()
        await self.acquirer.close()
        await self.engine.dispose()
