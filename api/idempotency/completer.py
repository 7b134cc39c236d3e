"""The completer: no key stays ``processing`` once its owner is gone.

Every ``IDEMPAY_COMPLETER_INTERVAL`` it takes over keys whose lease expired (a conditional
UPDATE on the lease token, so any number of workers can run it safely), re-drives the
issuer with the same derived issuer key, and finishes them; past the issuer deadline it
voids the issuer call and fences the key as ``aborted``.
"""

from __future__ import annotations

import asyncio

import structlog

from api.db import atomic, utcnow
from api.idempotency import store
from api.idempotency.store import KeyRecord
from api.metrics import RECOVERIES
from api.transactions.schemas import TransactionCreate
from api.transactions.service import TransactionService

log = structlog.get_logger("idempay.completer")


class Completer:
    def __init__(self, service: TransactionService, *, interval: float, batch: int = 100) -> None:
        self.service = service
        self.interval = interval
        self.batch = batch
        self.recovered = {"completed": 0, "aborted": 0, "pending": 0}
        self._limit = asyncio.Semaphore(32)

    async def run_once(self) -> int:
        now = utcnow()
        async with self.service.engine.connect() as conn:
            records = await store.expired_leases(conn, now=now, limit=self.batch)
        await asyncio.gather(*(self._recover(record) for record in records))
        return len(records)

    async def _recover(self, record: KeyRecord) -> None:
        async with self._limit:
            now = utcnow()
            async with atomic(self.service.engine) as conn:
                token = await store.take_over(
                    conn, record, now=now, lease_s=self.service.settings.lease_seconds
                )
            if token is None:
                return
            if await self.service.settle(record, token, now) is None:
                self._count("aborted", record)
                return
            body = TransactionCreate.model_validate_json(record.request or "{}")
            outcome = await self.service.drive(
                record.merchant_id,
                record.key,
                body,
                token=token,
                created_at=record.created_at,
                event="created",
            )
            self._count("completed" if outcome.status == 201 else "pending", record)

    def _count(self, result: str, record: KeyRecord) -> None:
        self.recovered[result] += 1
        RECOVERIES.labels(result).inc()
        log.info("key_recovered", result=result, merchant_id=record.merchant_id, key=record.key)

    async def run_forever(self) -> None:
        while True:
            try:
                await self.run_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # storage down: try again next tick
                log.warning("completer_tick_failed", error=type(exc).__name__)
            await asyncio.sleep(self.interval)
