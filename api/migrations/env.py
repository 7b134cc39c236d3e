"""Alembic environment: async engines (asyncpg / aiosqlite), URL passed in by ``api.migrate``.
On Citus the run ends by distributing the tables and installing the create's delegated calls,
in the same transaction and under the same lock (``api.migrate.distribute``,
``api.transactions.delegated.install``)."""

from __future__ import annotations

import asyncio

from alembic import context
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from api import models  # noqa: F401  (registers the tables)
from api.db import Base
from api.migrate import MIGRATION_LOCK, distribute, has_citus
from api.transactions import delegated

config = context.config
target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            # Several replicas run `idempay serve` (which migrates) at once: one migrates,
            # the others wait here, then find the schema at head. Released at commit.
            connection.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": MIGRATION_LOCK})
        context.run_migrations()
        if _at_head():  # the tables are distributable only in their latest shape
            distribute(connection)  # no-op unless the database has the citus extension
            if has_citus(connection):  # the create's claim and finish as delegated calls
                delegated.install(connection)


def _at_head() -> bool:
    heads = set(ScriptDirectory.from_config(config).get_heads())
    return set(context.get_context().get_current_heads()) == heads


async def _run_async() -> None:
    engine = create_async_engine(config.get_main_option("sqlalchemy.url") or "")
    async with engine.connect() as connection:
        await connection.run_sync(_run)
    await engine.dispose()


if context.is_offline_mode():
    context.configure(url=config.get_main_option("sqlalchemy.url"), target_metadata=target_metadata)
    with context.begin_transaction():
        context.run_migrations()
else:
    asyncio.run(_run_async())
