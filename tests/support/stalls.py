"""Stalls forced on a private Postgres database: a key held by another transaction (an
uncommitted row, as an operator's open transaction or a stuck writer holds it), a claim that
sleeps in a trigger (as a commit waiting on a synchronous standby, an I/O stall), and waits
until ``pg_stat_activity`` shows the server's statement waiting on either."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, TypeVar

import asyncpg
import httpx

from tests.support.backend import Backend
from tests.support.client import post_create
from tests.support.eventually import eventually_async
from tests.support.services import Server

T = TypeVar("T")

# Another create's claim of a key ($1 merchant id, $2 key), left uncommitted by its holder.
HELD_KEY_ROW = (
    "INSERT INTO idempotency_key (merchant_id, key, state, lease_token,"
    " created_at, updated_at) VALUES ($1, $2, 'processing', 1, now(), now())"
)
# The backends of this database (other than the one asking) waiting on a lock: their pids,
# their count.
_WAIT_ON_A_LOCK = (
    " FROM pg_stat_activity WHERE datname = current_database()"
    " AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
)
LOCK_WAITERS = "SELECT pid" + _WAIT_ON_A_LOCK
WAITING = "SELECT count(*)" + _WAIT_ON_A_LOCK
# The backends sleeping in the stalling trigger.
SLEEPING = (
    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
    " AND wait_event = 'PgSleep'"
)
STALL_TABLE = "claim_stall"
STALL = f"""
CREATE TABLE {STALL_TABLE} (key varchar(36) PRIMARY KEY, seconds float NOT NULL);
CREATE FUNCTION {STALL_TABLE}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_sleep(s.seconds) FROM {STALL_TABLE} AS s WHERE s.key = NEW.key;
  RETURN NEW;
END $$;
CREATE TRIGGER {STALL_TABLE} BEFORE INSERT ON idempotency_key
  FOR EACH ROW EXECUTE FUNCTION {STALL_TABLE}();
"""


def dsn(backend: Backend) -> str:
    """The Postgres backend's database, as asyncpg connects to it."""
    assert backend.database_url is not None, "a Postgres backend"
    return backend.database_url.replace("+asyncpg", "")


class Held:
    """A plain transaction of its own connection, holding what its statement took (the
    row it wrote, locked or updated); ``release`` rolls it back."""

    def __init__(self, conn: asyncpg.Connection, tx: Any) -> None:
        self.conn = conn
        self._tx = tx
        self.released = False

    async def release(self) -> None:
        if not self.released:
            self.released = True
            await self._tx.rollback()


@asynccontextmanager
async def held(dsn: str, statement: str, *args: object, **connect: Any) -> AsyncIterator[Held]:
    """A transaction that ran ``statement`` with ``args`` and is left open (an operator's
    ``BEGIN; UPDATE …``, a stuck writer), from a connection of its own (``connect``:
    asyncpg's options); rolled back, if the test did not, and closed at the exit."""
    conn = await asyncpg.connect(dsn, **connect)
    try:
        tx = conn.transaction()
        await tx.start()
        holder = Held(conn, tx)
        try:
            await conn.execute(statement, *args)
            yield holder
        finally:
            await holder.release()
    finally:
        await conn.close()


def held_key(
    dsn: str, merchant_id: str, key: str, **connect: Any
) -> AbstractAsyncContextManager[Held]:
    """Another create's claim of ``key``, not committed (``held``)."""
    return held(dsn, HELD_KEY_ROW, merchant_id, key, **connect)


async def until_seen(
    admin: asyncpg.Connection, query: str, *, what: str, within: float, interval: float = 0.01
) -> int:
    """Poll ``query`` (a count) on ``admin`` until it is at least one, for ``within``
    seconds at the most; return it."""
    count = await eventually_async(
        lambda: admin.fetchval(query),
        what=what,
        until=lambda n: n >= 1,
        timeout=within,
        interval=interval,
    )
    return int(count)


async def until_lock_waiters(
    admin: asyncpg.Connection, *, what: str, within: float, interval: float = 0.01
) -> list[int]:
    """The pids of the backends waiting on a lock, once there is one."""
    rows = await eventually_async(
        lambda: admin.fetch(LOCK_WAITERS), what=what, timeout=within, interval=interval
    )
    return [row[0] for row in rows]


async def start_stalled(
    watch: asyncpg.Connection, request: Awaitable[T], *, what: str, within: float = 10.0
) -> asyncio.Future[T]:
    """``request`` (a create of a key of ``install_stall``'s) started, once ``watch`` sees a
    statement sleeping in the stalling trigger; its future, not done."""
    pending = asyncio.ensure_future(request)
    await until_seen(watch, SLEEPING, what=what, within=within)
    return pending


def stalled_create(
    backend: Backend,
    server: Server,
    api_key: str,
    key: str,
    payload: Any,
    *,
    then: Callable[[], Awaitable[object]],
) -> httpx.Response:
    """A create of a key of ``install_stall``'s sent to ``server``; once its statement
    sleeps in the trigger, ``then()`` (a signal to the server, say); the create's answer."""

    async def run() -> httpx.Response:
        async with (
            admin(backend) as watch,
            httpx.AsyncClient(base_url=server.url, timeout=60) as client,
        ):
            pending = await start_stalled(
                watch,
                post_create(client, api_key, key, payload),
                what="the create's statement stalling",
            )
            await then()
            return await pending

    return asyncio.run(run())


def install_stall(backend: Backend, stalls: dict[str, float]) -> None:
    """The stalling trigger on the backend's database: the INSERT of each key of ``stalls``
    into idempotency_key sleeps its seconds (``SLEEPING`` counts the sleepers);
    ``stop_stalling`` empties the list."""

    async def install() -> None:
        conn = await asyncpg.connect(dsn(backend))
        try:
            await conn.execute(STALL)
            for key, seconds in stalls.items():
                await conn.execute(f"INSERT INTO {STALL_TABLE} VALUES ($1, $2)", key, seconds)
        finally:
            await conn.close()

    asyncio.run(install())


def stop_stalling(backend: Backend) -> None:
    backend.sql(f"DELETE FROM {STALL_TABLE}")


@asynccontextmanager
async def admin(backend: Backend) -> AsyncIterator[asyncpg.Connection]:
    """A connection of the test's own to the backend's database, to watch the server's."""
    conn = await asyncpg.connect(dsn(backend))
    try:
        yield conn
    finally:
        await conn.close()


def assert_refused_per_contract(answer: httpx.Response) -> None:
    """A create cut short by the server's shutdown, answered per contract: 409 (in flight) or
    503 (nothing processed), a problem document, its Idempotency-Status set."""
    assert answer.status_code in (409, 503), (answer.status_code, answer.text)
    assert answer.headers["content-type"].startswith("application/problem+json")
    assert answer.headers.get("Idempotency-Status") is not None
