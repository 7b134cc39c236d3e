"""``idempay webhooks``: deliver every outbox event to its merchant's endpoints, at least
once, in ``seq`` order per endpoint, signed (``signing``), with backoff and dead letters
(``queue``).

One tick: number committed events if no relay does (``relay.number_committed``) → queue
them for each active endpoint → for every endpoint at once, send its queue head after head
until one fails or is not yet due. The body is the outbox payload plus its ``seq`` (what
the relay publishes), the same bytes on every attempt but the signature's timestamp;
``Idempay-Event-Id`` is the outbox ``event_id``, stable across retries and replays, so a
receiver dedupes by it. A worker killed between a 2xx and its record sends that event
again: at least once. On Postgres one worker delivers at a time (a session advisory lock;
a second waits as a hot standby), so an endpoint never gets two events at once.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import httpx
import structlog
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from api.db import utcnow
from api.outbox.relay import number_committed
from api.webhooks import queue
from api.webhooks.queue import Backoff, Delivery, Target
from api.webhooks.signing import EVENT_ID_HEADER, HEADER, signature_header

log = structlog.get_logger("idempay.webhooks")
LOCK_ID = 0x1DE4_9A8  # pg advisory lock id for "the webhook worker"


def body_of(delivery: Delivery) -> bytes:
    payload = json.loads(delivery.payload or "{}")
    payload["seq"] = delivery.seq
    return json.dumps(payload, separators=(",", ":")).encode()


class WebhookWorker:
    def __init__(
        self,
        engine: AsyncEngine,
        client: httpx.AsyncClient,
        *,
        batch: int = 100,
        backoff: Backoff | None = None,
    ) -> None:
        self.engine = engine
        self.client = client  # its timeout bounds each attempt
        self.batch = batch
        self.backoff = backoff or Backoff()

    async def run_once(self) -> int:
        """One tick; returns the number of delivery attempts made."""
        await number_committed(self.engine, batch=self.batch)
        targets = await queue.active_targets(self.engine)
        for target in targets:
            await queue.fan_out(self.engine, target, batch=self.batch, now=utcnow())
        sent = await asyncio.gather(*(self._drain(target) for target in targets))
        return sum(sent)

    async def _drain(self, target: Target) -> int:
        attempts = 0
        while attempts < self.batch:
            delivery = await queue.head(self.engine, target.id)
            if delivery is None or delivery.next_attempt_at > utcnow():
                break
            error = await self._send(target, delivery) if delivery.payload else "event purged"
            await queue.record(self.engine, delivery, error, now=utcnow(), backoff=self.backoff)
            attempts += 1
            if error is not None:
                log.info("webhook_failed", endpoint=target.id, seq=delivery.seq, error=error)
                break
        return attempts

    async def _send(self, target: Target, delivery: Delivery) -> str | None:
        body = body_of(delivery)
        headers = {
            "Content-Type": "application/json",
            EVENT_ID_HEADER: delivery.event_id,
            HEADER: signature_header(target.secret, body, timestamp=int(utcnow().timestamp())),
        }
        try:
            response = await self.client.post(target.url, content=body, headers=headers)
        except httpx.HTTPError as exc:
            return f"{type(exc).__name__}: {exc}"[:200]
        if 200 <= response.status_code < 300:
            return None
        return f"HTTP {response.status_code}"

    async def run_forever(
        self, *, interval: float = 1.0, stop: Callable[[], bool] = lambda: False
    ) -> None:
        """Lead (Postgres), then tick, checking before each tick that the lock's session
        still holds it; a lost lock or a storage error: lead again."""
        while not stop():
            try:
                async with self.engine.connect() as lock_conn:
                    await _lead(lock_conn, stop, interval)
                    while not stop():
                        await _still_leading(lock_conn)
                        if await self.run_once() < self.batch:
                            await asyncio.sleep(interval)
            except Exception as exc:
                log.warning("webhooks_tick_failed", error=type(exc).__name__)
                await asyncio.sleep(interval)


async def _lead(conn: AsyncConnection, stop: Callable[[], bool], interval: float) -> None:
    """Wait until this worker holds the webhook lock (Postgres; no-op on SQLite), or stop."""
    if conn.dialect.name != "postgresql":
        return
    while not (await conn.execute(text(f"SELECT pg_try_advisory_lock({LOCK_ID})"))).scalar():
        await conn.commit()
        if stop():
            return
        await asyncio.sleep(max(interval, 0.2))
    await conn.commit()
    log.info("webhooks_leading")


async def _still_leading(conn: AsyncConnection) -> None:
    """Raise unless this connection's session still holds the webhook lock (Postgres)."""
    if conn.dialect.name != "postgresql":
        return
    held = await conn.execute(
        text(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = :lock "
            "AND granted AND pid = pg_backend_pid()"
        ),
        {"lock": LOCK_ID},
    )
    leading = bool(held.scalar())
    await conn.commit()
    if not leading:
        raise RuntimeError("this session no longer holds the webhook lock")
