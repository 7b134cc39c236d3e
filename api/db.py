"""Metadata, the engine factory and the ``atomic`` transaction helper.

The request path uses SQLAlchemy Core on ``AsyncConnection`` (no ORM unit of work): every
statement on the create path is measured, and the ORM layer roughly doubled its CPU cost.

Postgres (asyncpg) is the source of truth in production; SQLite (aiosqlite, WAL) is the
embedded default. On SQLite every transaction starts with ``BEGIN IMMEDIATE`` so writers
queue on the database lock instead of failing a lock upgrade half-way.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import DateTime, MetaData, event
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.orm import DeclarativeBase
from sqlalchemy.types import TypeDecorator

from api.config import Settings
from api.idempotency.waiters import SETTLED_KEYS, settled_here

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite has no time zones)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def utcnow() -> datetime:
    return datetime.now(UTC)


def create_engine(settings: Settings) -> AsyncEngine:
    url = settings.resolved_database_url
    if settings.is_sqlite:
        return _sqlite_engine(url)
    return create_async_engine(
        url,
        pool_size=settings.db_pool_size,
        max_overflow=0,  # overflow connections churn, and each new one re-prepares statements
        pool_timeout=settings.db_timeout,
        pool_pre_ping=False,
        connect_args={"timeout": settings.db_timeout, "command_timeout": 30},
        hide_parameters=True,  # a logged SQL error must not carry a stored card token
    )


def _sqlite_engine(url: str) -> AsyncEngine:
    path = url.split("///", 1)[1]
    if path and path != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    engine = create_async_engine(url, connect_args={"timeout": 30}, hide_parameters=True)

    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
        cursor = dbapi_conn.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn: Any) -> None:
        # A long read (the lake export) asks for a plain BEGIN: a WAL snapshot, no write lock.
        deferred = conn.get_execution_options().get("sqlite_deferred_begin", False)
        conn.exec_driver_sql("BEGIN" if deferred else "BEGIN IMMEDIATE")

    return engine


@asynccontextmanager
async def atomic(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """One database transaction: commit on success, roll back on any exception. Keys it
    settled (``store.complete`` / ``fence_owned``) wake this process's waiters after the
    commit, never before it and never after a rollback."""
    async with engine.begin() as conn:
        try:
            yield conn
        finally:
            settled = conn.info.pop(SETTLED_KEYS, ())
    for merchant_id, key in settled:
        settled_here(merchant_id, key)


_INSERT_IGNORE: dict[tuple[str, str], Any] = {}


def _insert_ignore(table: Any, dialect: str) -> Any:
    """``INSERT … ON CONFLICT DO NOTHING`` for a table, built once per dialect: building
    statements per request was a measured third of the create path's CPU."""
    cache_key = (table.name, dialect)
    statement = _INSERT_IGNORE.get(cache_key)
    if statement is None:
        module = postgresql if dialect == "postgresql" else sqlite
        statement = module.insert(table).on_conflict_do_nothing()
        _INSERT_IGNORE[cache_key] = statement
    return statement


async def insert_if_absent(conn: AsyncConnection, model: Any, values: dict[str, Any]) -> bool:
    """``INSERT … ON CONFLICT DO NOTHING``; True when this call inserted the row.

    On Postgres a concurrent insert of the same key waits for the other transaction and
    then does nothing: the unique index decides, exactly once.
    """
    result = await conn.execute(_insert_ignore(model.__table__, conn.dialect.name), values)
    return bool(result.rowcount)
