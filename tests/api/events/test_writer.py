"""The request-event writer (issue 22, items 3–4): a graceful shutdown never cuts a flush
short, and a batch retried after a lost COMMIT reply lands once, under the ids it was
recorded with. Real Postgres; the faults are a table lock and a cut TCP connection."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from api.config import Settings
from api.db import create_engine
from api.events.writer import Event, EventWriter
from api.main import create_app
from tests.support.backend import Backend
from tests.support.eventually import eventually_async

# CommandComplete("COMMIT"): what Postgres answers once a COMMIT has been made durable.
COMMIT_REPLY = b"C\x00\x00\x00\x0bCOMMIT\x00"
WAITING_INSERT = (
    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
    "AND wait_event_type = 'Lock' AND query ILIKE 'INSERT INTO request_event%'"
)


def _events(merchant: str, count: int) -> list[Event]:
    return [
        Event(
            ts=datetime.now(UTC),
            merchant_id=merchant,
            terminal_id="T-1",
            idempotency_key=str(uuid.uuid4()),
            endpoint="create",
            outcome="created",
            http_status=201,
            attempt=1,
            network="wifi",
            latency_ms=2.0,
        )
        for _ in range(count)
    ]


async def _rows(backend: Backend, merchant: str) -> tuple[int, int]:
    rows = await asyncio.to_thread(
        backend.sql,
        "SELECT count(*), count(DISTINCT event_id) FROM request_event WHERE merchant_id = :m",
        m=merchant,
    )
    return int(rows[0][0]), int(rows[0][1])


async def _wait_for_blocked_insert(backend: Backend) -> None:
    async def waiting() -> int:
        return int((await asyncio.to_thread(backend.sql, WAITING_INSERT))[0][0])

    await eventually_async(
        waiting, what="the writer's INSERT waiting on the table lock", timeout=30
    )


async def test_shutdown_finishes_the_flush_under_way_instead_of_cancelling_it(
    private_pg_backend: Backend,
) -> None:
    """SIGTERM → uvicorn runs the lifespan's shutdown while a flush's INSERT is running
    (held here by a table lock). Before, the writer was cancelled and the batch it had
    taken off the queue vanished: 20 of 20 events lost."""
    merchant = f"mer_{uuid.uuid4().hex[:12]}"
    settings = Settings(
        database_url=private_pg_backend.database_url,
        var_dir=private_pg_backend.tmp / "var",
        completer_enabled=False,
        event_flush_interval=0.05,
    )
    app = create_app(settings)
    locker = create_async_engine(private_pg_backend.url, poolclass=NullPool)
    lifespan = app.router.lifespan_context(app)
    await lifespan.__aenter__()
    try:
        async with locker.connect() as conn:
            await conn.execute(text("BEGIN"))
            await conn.execute(text("LOCK TABLE request_event IN SHARE MODE"))
            for event in _events(merchant, 20):
                app.state.ctx.events.record(event)
            await _wait_for_blocked_insert(private_pg_backend)
            shutdown = asyncio.create_task(lifespan.__aexit__(None, None, None))
            await asyncio.sleep(0)  # the shutdown has begun while the INSERT waits
            await conn.execute(text("COMMIT"))  # the INSERT can now finish
        await asyncio.wait_for(shutdown, 60)
    finally:
        await locker.dispose()
    assert await _rows(private_pg_backend, merchant) == (20, 20)


class _PgHop:
    """A TCP hop to Postgres with a fault hook. ``fault`` sees every chunk Postgres sends:
    when it answers True the connection is cut (both ways) instead of passing the chunk on.
    ``close_all()`` cuts every connection at once and ``shut`` refuses new ones (the
    database restarting, as ``make chaos``'s Postgres restart does)."""

    def __init__(self, fault: Callable[[bytes], bool] | None = None) -> None:
        self.fault = fault
        self.shut = False
        self.port = 0
        self._open: set[asyncio.StreamWriter] = set()

    @asynccontextmanager
    async def running(self) -> AsyncIterator[_PgHop]:
        server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        try:
            yield self
        finally:
            server.close()

    def close_all(self) -> None:
        self.shut = True
        for writer in list(self._open):
            writer.transport.abort()

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        if self.shut:
            client_w.transport.abort()
            return
        server_r, server_w = await asyncio.open_connection("127.0.0.1", 5432)
        ends = (client_w, server_w)
        self._open.update(ends)
        await asyncio.gather(
            self._pipe(client_r, server_w, ends, None),
            self._pipe(server_r, client_w, ends, self.fault),
            return_exceptions=True,
        )
        self._open.difference_update(ends)

    @staticmethod
    async def _pipe(
        r: asyncio.StreamReader,
        w: asyncio.StreamWriter,
        ends: tuple[asyncio.StreamWriter, ...],
        fault: Callable[[bytes], bool] | None,
    ) -> None:
        while data := await r.read(65536):
            if fault is not None and fault(data):
                for end in ends:
                    end.transport.abort()
                return
            w.write(data)
            await w.drain()
        w.close()


class _CutCommitReply:
    """The fault: once armed, let the server COMMIT and cut the connection instead of
    passing the reply on — the client cannot know the batch landed."""

    def __init__(self) -> None:
        self.armed = False
        self.cuts = 0

    def __call__(self, data: bytes) -> bool:
        if not (self.armed and COMMIT_REPLY in data):
            return False
        self.armed = False
        self.cuts += 1
        return True


async def test_a_batch_retried_after_a_lost_commit_reply_lands_once(
    private_pg_backend: Backend,
) -> None:
    merchant = f"mer_{uuid.uuid4().hex[:12]}"
    assert private_pg_backend.database_url is not None
    cutter = _CutCommitReply()
    async with _PgHop(cutter).running() as hop:
        url = private_pg_backend.database_url.replace(":5432/", f":{hop.port}/")
        engine = create_engine(Settings(database_url=url, var_dir=private_pg_backend.tmp / "v"))
        writer = EventWriter(engine, citus=False, batch_size=100, interval=60, max_queue=1000)
        try:
            for event in _events(merchant, 50):
                writer.record(event)
            cutter.armed = True
            assert await writer.flush() == 0  # "failed": the reply never came
            assert cutter.cuts == 1
            assert await writer.flush() == 50  # the retry
        finally:
            await engine.dispose()
    assert await _rows(private_pg_backend, merchant) == (50, 50)


async def test_shutdown_drain_waits_out_a_database_restart(private_pg_backend: Backend) -> None:
    """Chaos (90 s run): a rolling restart met a Postgres restart; the drain's first flush
    failed and the drain gave the queue up — an answered create never logged. The drain
    retries within its deadline instead."""
    merchant = f"mer_{uuid.uuid4().hex[:12]}"
    assert private_pg_backend.database_url is not None
    async with _PgHop().running() as gate:
        url = private_pg_backend.database_url.replace(":5432/", f":{gate.port}/")
        engine = create_engine(Settings(database_url=url, var_dir=private_pg_backend.tmp / "v"))
        writer = EventWriter(engine, citus=False, batch_size=100, interval=60, max_queue=1000)
        try:
            runner = asyncio.create_task(writer.run_forever())
            await asyncio.sleep(0)  # the runner starts, waiting out its interval
            gate.close_all()  # the database goes away just before the shutdown
            for event in _events(merchant, 30):
                writer.record(event)
            loop = asyncio.get_running_loop()
            loop.call_later(0.5, setattr, gate, "shut", False)  # and is back 0.5 s later
            assert await writer.close(runner, deadline=10.0) == 0
        finally:
            await engine.dispose()
    assert await _rows(private_pg_backend, merchant) == (30, 30)
