"""The advice worker: drains the reversal-advice queue toward the acquirer (contract §2.9).

Every ``IDEMPAY_ADVICE_INTERVAL`` it reads the due advices (``api/acquirer/advice.py``), owns
each attempt by a compare-and-set on its ``next_attempt_at`` (so any number of workers —
every API process runs one — send each attempt once; a repeated advice is harmless anyway:
the acquirer applies advices idempotently by RRN), sends it (0420 first, 0421 after) with no
database transaction open, and records the 0430 or backs off (1 s doubling to a minute).
It also publishes the queue's depth and oldest age as metrics.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta

import structlog
from sqlalchemy.ext.asyncio import AsyncEngine

from api.acquirer import advice
from api.acquirer.types import AcquirerError, ReversalRequest
from api.db import atomic, utcnow
from api.metrics import ACQUIRER_ADVICE_DEPTH, ACQUIRER_ADVICE_OLDEST_AGE, ACQUIRER_ADVICES_SENT

log = structlog.get_logger("idempay.advice")

Advise = Callable[[ReversalRequest], Awaitable[bool]]
# An attempt owned and not recorded (a crash) is due again after this; the app sets it past
# the advice's own timeout, so no second worker repeats an advice still awaiting its 0430.
ATTEMPT_SECONDS = 10.0


class AdviceWorker:
    def __init__(
        self,
        engine: AsyncEngine,
        advise: Advise,
        *,
        interval: float,
        batch: int = 64,
        observe: Callable[[], None] | None = None,
        attempt_s: float = ATTEMPT_SECONDS,
    ) -> None:
        self.attempt_s = attempt_s
        self.engine = engine
        self.advise = advise
        self.observe = observe
        self.interval = interval
        self.batch = batch

    async def run_once(self) -> int:
        """One pass; returns how many advices the acquirer acknowledged."""
        if self.observe is not None:
            self.observe()
        now = utcnow()
        async with self.engine.connect() as conn:
            count, oldest = await advice.depth(conn, now=now)
            ACQUIRER_ADVICE_DEPTH.set(count)
            ACQUIRER_ADVICE_OLDEST_AGE.set(oldest)
            if count == 0:
                return 0
            due = await advice.due(conn, now=now, limit=self.batch)
        owned = []
        until = now + timedelta(seconds=self.attempt_s)
        for item in due:
            async with atomic(self.engine) as conn:
                if await advice.take(conn, item, until=until):
                    owned.append(item)
        results = await asyncio.gather(*(self._send(item) for item in owned))
        return sum(results)

    async def _send(self, item: advice.Advice) -> bool:
        try:
            acknowledged = await self.advise(item.request())
            error = "" if acknowledged else "not acknowledged"
        except AcquirerError as exc:
            acknowledged, error = False, type(exc).__name__
        async with atomic(self.engine) as conn:
            if acknowledged:
                await advice.acknowledge(conn, item, now=utcnow())
            else:
                await advice.retry_later(conn, item, now=utcnow(), error=error)
        ACQUIRER_ADVICES_SENT.labels("acknowledged" if acknowledged else "retry").inc()
        if not acknowledged:
            log.info("advice_not_acknowledged", key=item.key, rrn=item.rrn, error=error)
        return acknowledged

    async def drain(self, *, timeout_s: float) -> int:
        """Passes until the queue is empty (or ``timeout_s``): for harnesses and tests.
        Returns the advices still queued."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout_s
        while True:
            await self.run_once()
            async with self.engine.connect() as conn:
                left, _ = await advice.depth(conn, now=utcnow())
            if left == 0 or loop.time() >= end:
                return left
            await asyncio.sleep(min(self.interval, 0.2))

    async def run_forever(self) -> None:
        while True:
            try:
                await self.run_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # storage or link down: the next pass tries again
                log.warning("advice_pass_failed", error=type(exc).__name__)
            await asyncio.sleep(self.interval)
