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
