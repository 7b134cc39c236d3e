"""``idempay webhooks``: deliver every outbox event to its merchant's endpoints, at least
once, in ``seq`` order per endpoint, signed (``signing``), with backoff and dead letters
(``queue``), only to destinations ``destinations`` allows.

A tick: number committed events if no relay does (``relay.number_committed``) → queue them
for each active endpoint → make sure each endpoint with work has its own delivery task,
which sends its queue head after head until one fails or is not yet due. Ticks never wait
for those tasks: a slow or stuck receiver holds up its own queue, never another endpoint's
(each endpoint has one attempt in flight at most; ``concurrency`` bounds them all).

An attempt resolves the host, refuses it unless every address is allowed, connects to a
checked address (never resolving the name again), and ends within ``deadline`` seconds
from start to status, whatever the receiver does (a trickled answer included); only the
status counts: a 2xx body is not read, any other's at most ``ERROR_BODY_BYTES`` (for
``last_error``).

The body is the outbox payload plus its ``seq`` (what the relay publishes), the same bytes
on every attempt but the signature's timestamp; ``Idempay-Event-Id`` is the outbox
``event_id``, stable across retries and replays, so a receiver dedupes by it. A worker
killed between a 2xx and its record sends that event again: at least once.

On Postgres one worker delivers at a time: it holds a session advisory lock and confirms
it every ``interval``; its lock session carries ``idle_session_timeout = lease``, so a
leader that stops confirming (its loop stuck, its process stopped) loses the lock to the
database and a standby (waiting for the lock) leads. A leader stopped inside a
transaction (the numbering's, holding the relay's transaction lock; a queue write, holding
rows) would keep what it holds past the lease, and the standby would lead but deliver
nothing, so the lease bounds transactions too: each one the worker opens carries
``idle_in_transaction_session_timeout = lease`` and names its worker (``application_name``
``idempay-webhooks <id>``), and every worker, leading or waiting to, ends the sessions of
another worker's transactions older than the lease. Postgres cannot end all of these
itself: a client stopped between a statement's parse and its execution (asyncpg prepares a
new statement, then binds it) leaves the session "active", waiting for the client, which
neither an idle timeout nor ``statement_timeout`` ends (Postgres 15). A leader that finds
the lock lost cancels its delivery tasks and closes the lock session before it waits to
lead again.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import httpx
import structlog
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from api import leader_sessions
from api.db import utcnow
from api.outbox.relay import number_committed
from api.webhooks import destinations, queue
from api.webhooks.destinations import AllowList, RefusedDestinationError, Resolver
from api.webhooks.queue import Backoff, Delivery, Target
from api.webhooks.signing import EVENT_ID_HEADER, HEADER, signature_header

log = structlog.get_logger("idempay.webhooks")
LOCK_ID = 0x1DE4_9A8  # pg advisory lock id for "the webhook worker"
TAG = "idempay-webhooks"  # application_name of a worker's session in a transaction: TAG <id>
ERROR_BODY_BYTES = 4096  # of a non-2xx answer's body, read for last_error; the rest is not
DEFAULT_DEADLINE = 10.0


def body_of(delivery: Delivery) -> bytes:
    payload = json.loads(delivery.payload or "{}")
    payload["seq"] = delivery.seq
    return json.dumps(payload, separators=(",", ":")).encode()


def _deadline_of(client: httpx.AsyncClient) -> float:
    timeout = client.timeout
    parts = [t for t in (timeout.connect, timeout.read, timeout.write, timeout.pool) if t]
    return max(parts) if parts else DEFAULT_DEADLINE


async def _error_text(response: httpx.Response) -> str:
    """``HTTP <status>`` and the printable start of at most ERROR_BODY_BYTES of its body."""
    head = bytearray()
    try:
        async for chunk in response.aiter_raw():
            head += chunk
            if len(head) >= ERROR_BODY_BYTES:
                break
    except httpx.HTTPError:
        pass
    snippet = "".join(
        c if c.isprintable() else " "
        for c in bytes(head[:ERROR_BODY_BYTES]).decode(errors="replace")
    )
    snippet = " ".join(snippet.split())[:120]
    return f"HTTP {response.status_code}" + (f": {snippet}" if snippet else "")


class WebhookWorker:
    def __init__(
        self,
        engine: AsyncEngine,
        client: httpx.AsyncClient,
        *,
        batch: int = 100,
        backoff: Backoff | None = None,
        allow: AllowList | None = None,
        resolver: Resolver | None = None,
        deadline: float | None = None,
        concurrency: int | None = None,
        lease: float | None = None,
    ) -> None:
        """``allow``, ``concurrency`` and ``lease`` default to the settings
        (``IDEMPAY_WEBHOOK_*``); ``deadline`` (seconds per attempt, start to status) to the
        client's longest timeout."""
        if allow is None or concurrency is None or lease is None:
            from api.config import Settings

            settings = Settings()
            allow = allow if allow is not None else AllowList.parse(settings.webhook_allow_private)
            concurrency = concurrency or settings.webhook_concurrency
            lease = lease or settings.webhook_lease
        self.lease = lease
        self._bound = lease  # how old a transaction of the worker may grow (run_forever's)
        self._tag = leader_sessions.name(TAG)
        self.engine = leader_sessions.bounded(engine, self._tag, lambda: self._bound)
        self.client = client
        self.batch = batch
        self.backoff = backoff or Backoff()
        self.allow = allow
        self.resolver = resolver or destinations.system_resolver
        self.deadline = deadline or _deadline_of(client)
        self._slots = asyncio.Semaphore(concurrency)
        self._drains: dict[str, asyncio.Task[int]] = {}

    async def _queue_new(self) -> tuple[list[Target], bool]:
        """Number and queue what is new; the active endpoints, and whether a batch was full."""
        full = await number_committed(self.engine, batch=self.batch) >= self.batch
        targets = await queue.active_targets(self.engine)
        for target in targets:
            queued = await queue.fan_out(self.engine, target, batch=self.batch, now=utcnow())
            full = full or queued >= self.batch
        return targets, full

    async def run_once(self) -> int:
        """One tick that waits for its attempts (``--once``); returns how many were made."""
        targets, _ = await self._queue_new()
        sent = await asyncio.gather(*(self._drain(target, self.batch) for target in targets))
        return sum(sent)

    async def _tick(self) -> bool:
        """Queue what is new and start a delivery task for every endpoint without one; never
        waits for those tasks. True when there is more to queue at once."""
        targets, full = await self._queue_new()
        active = {target.id for target in targets}
        for endpoint_id, task in list(self._drains.items()):
            if task.done():
                del self._drains[endpoint_id]
                if not task.cancelled() and task.exception() is not None:
                    log.warning(
                        "webhook_drain_failed",
                        endpoint=endpoint_id,
                        error=type(task.exception()).__name__,
                    )
            elif endpoint_id not in active:
                task.cancel()  # removed: its attempt in flight is abandoned
        for target in targets:
            if target.id not in self._drains:
                self._drains[target.id] = asyncio.create_task(self._drain(target, None))
        return full

    async def _stop_drains(self) -> None:
        tasks = list(self._drains.values())
        self._drains.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _drain(self, target: Target, limit: int | None) -> int:
        """Send the endpoint's queue head after head until one fails, the next is not due,
        or ``limit`` attempts were made."""
        attempts = 0
        while limit is None or attempts < limit:
            delivery = await queue.head(self.engine, target.id)
            if delivery is None or delivery.next_attempt_at > utcnow():
                break
            if delivery.payload:
                async with self._slots:
                    error = await self._send(target, delivery)
            else:
                error = "event purged"
            await queue.record(self.engine, delivery, error, now=utcnow(), backoff=self.backoff)
            attempts += 1
            if error is not None:
                log.info("webhook_failed", endpoint=target.id, seq=delivery.seq, error=error)
                break
        return attempts

    async def _send(self, target: Target, delivery: Delivery) -> str | None:
        """One attempt, within ``deadline``: None for a 2xx, else what went wrong."""
        body = body_of(delivery)
        headers = {
            "Content-Type": "application/json",
            "Accept-Encoding": "identity",
            EVENT_ID_HEADER: delivery.event_id,
            HEADER: signature_header(target.secret, body, timestamp=int(utcnow().timestamp())),
        }
        try:
            async with asyncio.timeout(self.deadline):
                return await self._post(httpx.URL(target.url), body, headers)
        except TimeoutError:
            return f"Timeout: no status within {self.deadline:g} s"
        except RefusedDestinationError as exc:
            return str(exc)[:200]
        except OSError as exc:  # the name does not resolve
            return f"unresolved host: {type(exc).__name__}: {exc}"[:200]
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            return f"{type(exc).__name__}: {exc}"[:200]

    async def _post(self, url: httpx.URL, body: bytes, headers: dict[str, str]) -> str | None:
        host = url.raw_host.decode("ascii")
        port = url.port or (443 if url.scheme == "https" else 80)
        addresses = await destinations.resolve(host, port, self.allow, self.resolver)
        extensions = {"sni_hostname": host} if url.scheme == "https" else {}
        headers = {**headers, "Host": url.netloc.decode("ascii")}
        refused: httpx.ConnectError | None = None
        for address in addresses:  # each one checked; the name is not resolved again
            request = self.client.build_request(
                "POST",
                url.copy_with(host=str(address)),
                content=body,
                headers=headers,
                extensions=extensions,
            )
            try:
                response = await self.client.send(request, stream=True, follow_redirects=False)
            except httpx.ConnectError as exc:
                refused = exc
                continue
            try:
                if 200 <= response.status_code < 300:
                    return None  # the body is not read
                return await _error_text(response)
            finally:
                await response.aclose()
        assert refused is not None
        raise refused

    async def run_forever(
        self, *, interval: float = 1.0, stop: Callable[[], bool] = lambda: False
    ) -> None:
        """Lead (Postgres), then tick every ``interval``, confirming before each tick that
        the lock's session still holds it; a lost lock or a storage error: stop delivering,
        close the lock session, lead again. Leading or waiting to, it ends the sessions of
        other workers' transactions older than the lease (``_end_stale``)."""
        lease = max(self.lease, 3 * interval)  # a lease shorter than a tick loses every lock
        self._bound = lease
        while not stop():
            try:
                async with self.engine.connect() as lock_conn:
                    try:
                        await _lead(lock_conn, stop, interval, lease, self._tag)
                        while not stop():
                            await _still_leading(lock_conn)
                            await _end_stale(lock_conn, self._tag, lease)
                            async with asyncio.timeout(lease):
                                more = await self._tick()
                            if not more:
                                await asyncio.sleep(interval)
                    finally:
                        await self._stop_drains()
                        await _close_session(lock_conn)
            except Exception as exc:
                log.warning("webhooks_tick_failed", error=type(exc).__name__)
                await asyncio.sleep(interval)


async def _lead(
    conn: AsyncConnection, stop: Callable[[], bool], interval: float, lease: float, tag: str
) -> None:
    """Wait until this worker holds the webhook lock (Postgres; no-op on SQLite), or stop,
    ending stale transactions of other workers meanwhile (a stopped leader's lock session
    may be stuck in one). The session that holds the lock ends by itself once idle for
    ``lease`` seconds, and is named ``tag`` all along (a transaction's name is its own)."""
    if conn.dialect.name != "postgresql":
        return
    await leader_sessions.lock_session(conn, tag, lease)
    while not (await conn.execute(text(f"SELECT pg_try_advisory_lock({LOCK_ID})"))).scalar():
        await conn.commit()
        if stop():
            return
        await _end_stale(conn, tag, lease)
        await asyncio.sleep(max(interval, 0.2))
    await conn.commit()
    log.info("webhooks_leading")


async def _end_stale(conn: AsyncConnection, tag: str, lease: float) -> None:
    """End the sessions of other webhook workers' transactions (this database, this role)
    that began more than ``lease`` seconds ago: their worker has stopped (a live one's
    transactions last milliseconds; its ticks are bounded by the lease), and what they hold
    (the webhook lock, the numbering's lock, queue rows) would otherwise stay held."""
    for pid, name in await leader_sessions.end_stale(conn, TAG, tag, lease):
        log.warning("webhooks_stale_session_ended", pid=pid, worker=name)


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


async def _close_session(conn: AsyncConnection) -> None:
    """Postgres: end the lock's session (and the lock with it) rather than hand a session
    that may still hold the lock back to the pool."""
    if conn.dialect.name == "postgresql":
        await conn.invalidate()
