"""The completer: no key stays ``processing`` once its owner is gone.

Every ``IDEMPAY_COMPLETER_INTERVAL`` it takes over keys whose lease expired (a conditional
UPDATE on the lease token, so any number of workers can run it safely) and settles them
(``api/transactions/recovery.py``): an online key's 0200 may have left, so it is never sent
again — the key ends declined / acquirer_timeout with its 0420 reversal advice queued in the
same commit; an offline sale's 0220 advice is repeated (0221) until the acquirer answers.

It is shared by every merchant, so it is fair between them (docs/security.md, "Noisy
neighbours"): a repeated advice the acquirer does not answer holds its slot for the whole
acquirer timeout, and one merchant's flood of such keys must not delay anyone else's.

* ``slots`` re-drives run at once; one merchant holds at most ``per_merchant`` of them while
  others wait, and may use the slots nobody else wants except ``reserve`` kept free, so a
  merchant whose key comes due always finds one at the next tick;
* free slots are dealt round-robin between merchants, each merchant's keys in deadline order
  (the due keys are read per merchant, so a merchant with few keys is never behind a page of
  another's);
* a tick admits work into free slots without waiting for the re-drives already running;
* a key whose acquirer keeps not answering backs off (doubling, up to
  ``BACKOFF_MAX_SECONDS``); an offline sale's backoff is also written to its lease
  (``lease_until``), so a merchant's advices waiting out an acquirer outage are not read as
  due and never crowd its other keys out of the due read.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from datetime import datetime, timedelta

import structlog
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from api.db import atomic, utcnow
from api.idempotency import store
from api.idempotency.store import KeyRecord, KeyState
from api.metrics import RECOVERIES
from api.models import IdempotencyKey
from api.transactions import recovery
from api.transactions.recovery import Recovered
from api.transactions.service import TransactionService

log = structlog.get_logger("idempay.completer")

BACKOFF_MAX_SECONDS = 30.0
_Key = tuple[str, str]  # (merchant_id, key)


async def due_per_merchant(
    conn: AsyncConnection, *, now: datetime, per_merchant: int, limit: int
) -> list[KeyRecord]:
    """Keys whose lease expired: each merchant's ``per_merchant`` nearest deadlines, the
    first of every merchant before the second of any (at most ``limit`` in all)."""
    order = (IdempotencyKey.deadline_at.is_(None), IdempotencyKey.deadline_at)
    rank = func.row_number().over(partition_by=IdempotencyKey.merchant_id, order_by=order)
    ranked = (
        select(*store._COLUMNS, rank.label("rank"))
        .where(IdempotencyKey.state == KeyState.PROCESSING, IdempotencyKey.lease_until < now)
        .subquery()
    )
    columns = [ranked.c[column.key] for column in store._COLUMNS]
    rows = await conn.execute(
        select(*columns)
        .where(ranked.c.rank <= per_merchant)
        .order_by(ranked.c.rank, ranked.c.deadline_at)
        .limit(limit)
    )
    return [KeyRecord(**row._asdict()) for row in rows]


class Completer:
    def __init__(
        self,
        service: TransactionService,
        *,
        interval: float,
        slots: int = 32,
        per_merchant: int | None = None,
    ) -> None:
        self.service = service
        self.interval = interval
        self.slots = slots
        self.per_merchant = per_merchant or max(1, slots // 4)
        self.reserve = max(1, slots // 8)
        self.recovered = {Recovered.COMPLETED: 0, Recovered.ABORTED: 0, Recovered.PENDING: 0}
        self._running: dict[_Key, asyncio.Task[None]] = {}
        self._busy: Counter[str] = Counter()  # merchant -> keys of it being re-driven
        self._backoff: dict[_Key, tuple[int, float]] = {}  # -> (failures, not before)

    async def run_once(self) -> int:
        """One tick, waiting for the re-drives it started (the CLI and tests)."""
        started = await self.admit()
        await asyncio.gather(*started, return_exceptions=True)
        return len(started)

    async def admit(self) -> list[asyncio.Task[None]]:
        """Start re-drives of due keys in the free slots, fairly; do not wait for them."""
        free = self.slots - len(self._running)
        if free <= 0:
            return []
        async with self.service.engine.connect() as conn:
            records = await due_per_merchant(
                conn,
                now=utcnow(),
                per_merchant=self.per_merchant * 4,
                limit=max(self.slots * 8, 256),
            )
        started = []
        for record in self._fair(records, free):
            key = (record.merchant_id, record.key)
            task = asyncio.create_task(self._recover(record), name=f"complete {record.key}")
            self._running[key] = task
            self._busy[record.merchant_id] += 1
            task.add_done_callback(functools.partial(self._done, key))
            started.append(task)
        return started

    def _fair(self, records: Sequence[KeyRecord], free: int) -> list[KeyRecord]:
        """Round-robin over merchants, each in deadline order: first within the per-merchant
        cap; then, so that one merchant alone is not slowed down, the slots nobody else
        wants — all but ``reserve`` of them, kept free for a merchant whose key is due next."""
        now = time.monotonic()
        self._forget_stale(now)
        queues: dict[str, list[KeyRecord]] = defaultdict(list)
        for record in records:  # already in deadline order within each merchant
            key = (record.merchant_id, record.key)
            if key in self._running or self._backoff.get(key, (0, 0.0))[1] > now:
                continue
            queues[record.merchant_id].append(record)
        chosen: list[KeyRecord] = []
        taken: Counter[str] = Counter()
        for cap, limit in ((self.per_merchant, free), (self.slots, free - self.reserve)):
            waiting = {merchant: queue for merchant, queue in queues.items() if queue}
            while len(chosen) < limit and waiting:
                for merchant in list(waiting):
                    if len(chosen) >= limit:
                        break
                    if not waiting[merchant] or self._busy[merchant] + taken[merchant] >= cap:
                        del waiting[merchant]
                        continue
                    chosen.append(waiting[merchant].pop(0))
                    taken[merchant] += 1
        return chosen

    def _done(self, key: _Key, _task: asyncio.Task[None]) -> None:
        self._running.pop(key, None)
        self._busy[key[0]] -= 1
        if self._busy[key[0]] <= 0:
            del self._busy[key[0]]

    def _forget_stale(self, now: float) -> None:
        if len(self._backoff) > 10_000:
            for key in [k for k, (_n, at) in self._backoff.items() if at < now]:
                del self._backoff[key]

    def _back_off(self, record: KeyRecord, *, advice: bool = False) -> float:
        key = (record.merchant_id, record.key)
        failures = self._backoff.get(key, (0, 0.0))[0] + 1
        delay = min(BACKOFF_MAX_SECONDS, self.interval * 2.0 ** min(failures, 16))
        if record.deadline_at is not None and not advice:  # still voided and fenced on time
            delay = min(delay, max(0.0, (record.deadline_at - utcnow()).total_seconds()))
        self._backoff[key] = (failures, time.monotonic() + delay)
        return delay

    async def _hold_advice(self, record: KeyRecord, delay: float) -> None:
        """An advice the issuer did not answer: its lease (ours, the take-over's token) runs
        until the backoff ends, so it is not due — nor read — before then."""
        until = utcnow() + timedelta(seconds=delay)
        async with atomic(self.service.engine) as conn:
            await store.release(
                conn,
                merchant_id=record.merchant_id,
                key=record.key,
                token=record.lease_token + 1,
                until=until,
            )

    async def _recover(self, record: KeyRecord) -> None:
        try:
            recovered = await recovery.recover(self.service, record, now=utcnow())
        except Exception as exc:  # storage down: the lease runs out, next tick tries again
            log.warning("key_recovery_failed", error=type(exc).__name__, key=record.key)
            return
        if recovered.result == Recovered.LOST:
            return
        if recovered.result == Recovered.PENDING:
            advice = recovery.is_advice(record)
            delay = self._back_off(record, advice=advice)
            if advice:
                try:
                    await self._hold_advice(record, delay)
                except Exception as exc:  # storage down: due again at once, backed off here
                    log.warning("advice_hold_failed", error=type(exc).__name__, key=record.key)
        else:
            self._backoff.pop((record.merchant_id, record.key), None)
        self._count(recovered.result, record)

    def _count(self, result: Recovered, record: KeyRecord) -> None:
        self.recovered[result] += 1
        RECOVERIES.labels(result).inc()
        log.info("key_recovered", result=result, merchant_id=record.merchant_id, key=record.key)

    async def run_forever(self) -> None:
        try:
            while True:
                try:
                    await self.admit()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # storage down: try again next tick
                    log.warning("completer_tick_failed", error=type(exc).__name__)
                await asyncio.sleep(self.interval)
        finally:
            running = list(self._running.values())
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
