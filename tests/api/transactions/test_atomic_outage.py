"""api.db.atomic under a storage failure: the connection is cut inside the transaction (a
Postgres restart, a failover). What comes out is the driver's error, judged "storage
unavailable" (503), not SQLAlchemy's PendingRollbackError from reading the invalidated
connection afterwards — which the server answered 500 (test_read_only_primary[phased],
about one run in three)."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import text

from api.db import atomic, create_engine
from api.storage_errors import storage_unavailable
from tests.support.backend import Backend


async def test_a_connection_cut_inside_atomic_is_storage_unavailable(
    private_pg_backend: Backend,
) -> None:
    engine = create_engine(private_pg_backend.settings)
    try:
        with pytest.raises(Exception) as raised:  # noqa: PT011 — the type is the question
            async with atomic(engine) as conn:
                pid = (await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one()
                await asyncio.to_thread(
                    private_pg_backend.sql, "SELECT pg_terminate_backend(:p)", p=pid
                )
                await conn.execute(text("SELECT 1"))
        assert storage_unavailable(raised.value), repr(raised.value)
        async with atomic(engine) as conn:  # and the pool serves the next transaction
            assert (await conn.execute(text("SELECT 1"))).scalar_one() == 1
    finally:
        await engine.dispose()
