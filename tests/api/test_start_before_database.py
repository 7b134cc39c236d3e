"""A worker that starts before its database answers (the deployed API runs with
``--no-migrate``: a replica restarted while Postgres is down or failing over) waits for it,
instead of failing its start at once — and still fails, with the database's error, when it
never comes (``api.main.database_has_citus``)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from api.config import Settings
from api.db import create_engine
from api.main import database_has_citus
from idempay_tools.serve_process import free_port
from tests.support.backend import Backend


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    writer.close()


async def _forward(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
    """A plain TCP forwarder to the shared Postgres: the database 'comes up' on our port."""
    server_r, server_w = await asyncio.open_connection("127.0.0.1", 5432)
    await asyncio.gather(_pipe(client_r, server_w), _pipe(server_r, client_w))


def _engine_on(port: int, pg_backend: Backend) -> Settings:
    url = pg_backend.url.replace("127.0.0.1:5432", f"127.0.0.1:{port}")
    assert url != pg_backend.url
    return Settings(database_url=url, db_pool_size=2)


async def test_a_worker_waits_for_a_database_that_comes_up_late(pg_backend: Backend) -> None:
    port = free_port()
    engine = create_engine(_engine_on(port, pg_backend))
    try:
        probe = asyncio.create_task(database_has_citus(engine, wait=20.0))
        await asyncio.sleep(1.0)  # nothing listens yet: the probe is refused and retries
        assert not probe.done()
        server = await asyncio.start_server(_forward, "127.0.0.1", port)
        try:
            assert await asyncio.wait_for(probe, 15.0) is False  # plain Postgres
        finally:
            server.close()
    finally:
        await engine.dispose()


async def test_a_database_that_never_comes_fails_the_start(pg_backend: Backend) -> None:
    engine = create_engine(_engine_on(free_port(), pg_backend))
    try:
        with pytest.raises(OSError):  # connection refused, after the wait
            await database_has_citus(engine, wait=0.6)
    finally:
        await engine.dispose()


async def test_a_database_that_does_not_exist_fails_the_start_at_once(
    pg_backend: Backend,
) -> None:
    url = pg_backend.url.rsplit("/", 1)[0] + "/idempay_no_such_database"
    engine = create_engine(Settings(database_url=url, db_pool_size=2))
    started = asyncio.get_running_loop().time()
    try:
        with pytest.raises(Exception, match="does not exist"):
            await database_has_citus(engine, wait=30.0)
    finally:
        await engine.dispose()
    assert asyncio.get_running_loop().time() - started < 10.0  # not after the 30 s wait
