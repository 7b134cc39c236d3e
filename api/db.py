"""Metadata, the engine factory and the ``atomic`` transaction helper.

The request path uses SQLAlchemy Core on ``AsyncConnection`` (no ORM unit of work): every
statement on the create path is measured, and the ORM layer roughly doubled its CPU cost.

Postgres (asyncpg) is the source of truth in production; SQLite (aiosqlite, WAL) is the
embedded default. On SQLite every transaction starts with ``BEGIN IMMEDIATE`` so writers
queue on the database lock instead of failing a lock upgrade half-way.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager, suppress
from contextvars import ContextVar
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy.exc
from sqlalchemy import DateTime, MetaData, event, make_url
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.orm import DeclarativeBase
from sqlalchemy.types import TypeDecorator

from api.config import Settings
from api.sqlite_wal import out_of_space, wal_keeper, wal_limit_bytes

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
        try:
            value = value.astimezone(UTC)
        except OverflowError:  # the edges refuse such input (422); never bind a wrong instant
            raise ValueError(f"datetime out of range in UTC: {value.isoformat()}") from None
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def utcnow() -> datetime:
    return datetime.now(UTC)


def iso(moment: datetime | None) -> str | None:
    """A stored instant as the API and the outbox write it: RFC 3339, UTC as ``Z``."""
    if moment is None:
        return None
    return moment.isoformat().replace("+00:00", "Z")


def split_budget(db_pool_size: int) -> tuple[int, int]:
    """``IDEMPAY_DB_POOL_SIZE`` shared by a serving worker's two pools: (the engine's, the hot
    path's ``DriverPool``). The engine writes — every create's claim and finish, the
    settlements, the completer, the advice worker, the request-event flush; the hot path
    reads (a replay's or a lookup's key and transaction, one round trip each). Half each,
    the odd one to the engine (a create costs it two transactions). A budget of 1 still opens
    one of each."""
    hot = max(1, db_pool_size // 2)
    return max(1, db_pool_size - hot), hot


def create_engine(settings: Settings, *, pool_size: int | None = None) -> AsyncEngine:
    """The SQLAlchemy engine; ``pool_size`` overrides ``IDEMPAY_DB_POOL_SIZE`` (a serving
    worker passes the engine's share of the budget, ``split_budget``)."""
    url = settings.resolved_database_url
    if settings.is_sqlite:
        return _sqlite_engine(url)
    return create_async_engine(
        url,
        pool_size=pool_size or settings.db_pool_size,
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
    # The WAL's bound and the full disk (api/sqlite_wal.py, WalKeeper), shared with the
    # hot path's writer thread: a write transaction first restarts a WAL past its bound, and is
    # refused before it begins while no checkpoint can finish on a full disk (503).
    keeper = wal_keeper(path) if path and path != ":memory:" else None
    engine = create_async_engine(url, connect_args={"timeout": 30}, hide_parameters=True)

    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
        cursor = dbapi_conn.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.execute("PRAGMA foreign_keys=ON")
        # the WAL's bound (api/sqlite_wal.py, WalKeeper): whichever
        # connection starts the WAL over trims its file back to it
        cursor.execute(f"PRAGMA journal_size_limit={wal_limit_bytes()}")
        cursor.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn: Any) -> None:
        # A long read (the lake export) asks for a plain BEGIN: a WAL snapshot, no write lock.
        deferred = conn.get_execution_options().get("sqlite_deferred_begin", False)
        if not deferred and keeper is not None:
            new_key = conn.get_execution_options().get("idempay_new_key", False)
            refused = keeper.before_write(
                lambda sql: conn.exec_driver_sql(sql).fetchone(), new_key=new_key
            )
            if refused is not None:  # as a failed BEGIN would be: OperationalError, a 503
                raise sqlalchemy.exc.OperationalError(
                    "BEGIN IMMEDIATE", None, sqlite3.OperationalError(refused)
                )
        conn.exec_driver_sql("BEGIN" if deferred else "BEGIN IMMEDIATE")

    @event.listens_for(engine.sync_engine, "handle_error")
    def _on_error(context: Any) -> None:
        if keeper is not None and out_of_space(context.original_exception):
            keeper.saw(context.original_exception)

    return engine


def disk_refuses_writes(engine: AsyncEngine) -> bool:
    """The embedded SQLite's disk has no room for a new key now (``WalKeeper.refusing``):
    creates are refused (503) while replays and lookups are answered. False elsewhere."""
    path = engine.url.database
    if engine.dialect.name != "sqlite" or not path or path == ":memory:":
        return False
    return wal_keeper(path).refusing()


# Set while an ``atomic`` transaction is open in this task (``assert_no_transaction``).
TRANSACTION_OPEN: ContextVar[bool] = ContextVar("idempay_transaction_open", default=False)
# ``Connection.info`` names whose items a transaction collected, and what is done with them
# once it committed (``after_commit``).
_AFTER_COMMIT: dict[str, Callable[[Sequence[Any]], None]] = {}


def after_commit(name: str, hook: Callable[[Sequence[Any]], None]) -> None:
    """``hook(items)`` once an ``atomic`` transaction that appended ``items`` to
    ``conn.info[name]`` has committed — never before the commit, never after a rollback (the
    items are dropped then). Registered by the layer that collects them: the waiters
    (``api.idempotency.waiters``) wake on the keys ``store.complete`` / ``fence_owned``
    settled."""
    _AFTER_COMMIT[name] = hook


@asynccontextmanager
async def atomic(engine: AsyncEngine, *, new_key: bool = False) -> AsyncIterator[AsyncConnection]:
    """One database transaction: commit on success, roll back on any exception. What it
    collected for after its commit (``after_commit``: the keys it settled, which wake this
    process's waiters) is handed on after the commit, never before it and never after a
    rollback. ``new_key``: the transaction claims a
    new key — on a nearly full SQLite disk it is refused first (``WalKeeper.before_write``)."""
    opened = TRANSACTION_OPEN.set(True)
    try:
        async with engine.connect() as conn:
            if new_key and engine.dialect.name == "sqlite":  # only its WalKeeper reads it
                await conn.execution_options(idempay_new_key=True)
            async with conn.begin():
                try:
                    yield conn
                except BaseException:
                    _drop_collected(conn)
                    raise  # the driver's own error (a lost connection stays a 503)
                collected = _collected(conn)
    finally:
        TRANSACTION_OPEN.reset(opened)
    _hand_on(collected)


def _drop_collected(conn: AsyncConnection) -> None:
    """What ``conn``'s work collected for after its commit, dropped: it did not commit."""
    with suppress(Exception):  # an invalidated connection: its info goes
        for name in _AFTER_COMMIT:
            conn.info.pop(name, None)


def _collected(conn: AsyncConnection) -> list[tuple[Callable[[Sequence[Any]], None], Any]]:
    return [(hook, conn.info.pop(name, ())) for name, hook in _AFTER_COMMIT.items()]


def _hand_on(collected: list[tuple[Callable[[Sequence[Any]], None], Any]]) -> None:
    for hook, items in collected:
        if items:
            hook(items)


@asynccontextmanager
async def autocommit(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """A connection of ``engine`` (an engine with ``isolation_level="AUTOCOMMIT"``) on which
    each statement is a transaction of its own — Citus's delegated calls
    (``api.transactions.delegated``). What the block collected for after its commit
    (``after_commit``) is handed on once the block ended without an error, each of its
    statements then having committed; never after an error."""
    async with engine.connect() as conn:
        try:
            yield conn
        except BaseException:
            _drop_collected(conn)
            raise
        collected = _collected(conn)
    _hand_on(collected)


def assert_no_transaction() -> None:
    """The acquirer link's guard before every write to the acquirer: no database
    transaction of ``atomic`` may be open in the calling task across a network call."""
    if TRANSACTION_OPEN.get():
        raise AssertionError("an acquirer call with a database transaction open")


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


def _expire(waiter: asyncio.Future[Any]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError("no database connection freed up in time"))


class PoolClosedError(ConnectionError):
    """The pool was closed (the server is shutting down)."""


class DriverPool:
    """asyncpg connections of the hot path, without SQLAlchemy's checkout and check-in.

    The create, replay and lookup of ``api/transactions/pg_create.py`` each run one prepared
    statement in autocommit: the statement is its own transaction, so a connection comes back
    with nothing to reset, and taking one is a ``list.pop`` while one is idle. At most
    ``size`` connections are open (its share of ``IDEMPAY_DB_POOL_SIZE``, ``split_budget``);
    they are opened on demand with the engine's connect arguments (the same URL, hosts,
    ``target_session_attrs``, SSL), and a caller finding none idle waits up to ``timeout``
    (``IDEMPAY_DB_TIMEOUT``) in line, first come first served.

    ``discard(conn, outage=…)`` closes a connection instead of keeping it: the caller's
    statement was cut short, or failed for want of storage (``api.storage_errors``). An
    outage also retires every idle connection opened before it: after a
    Postgres restart or a failover they are all dead or on a demoted node, and the next
    requests would otherwise each fail once on one of them (what SQLAlchemy does on a
    disconnect, too). ``close`` (the app's shutdown) closes the idle ones and every one
    handed back afterwards."""

    def __init__(self, url: str, size: int, *, timeout: float, command_timeout: float = 30) -> None:
        from sqlalchemy.dialects.postgresql.asyncpg import PGDialect_asyncpg

        dialect = PGDialect_asyncpg()  # type: ignore[no-untyped-call]
        _args, connect_args = dialect.create_connect_args(make_url(url))  # type: ignore[no-untyped-call]
        connect_args.pop("async_creator_fn", None)
        connect_args.pop("prepared_statement_name_func", None)
        cache = connect_args.pop("prepared_statement_cache_size", None)
        if cache is not None:  # e.g. 0 behind a transaction-pooling proxy
            connect_args["statement_cache_size"] = int(cache)
        self._connect_args = {
            **connect_args,
            "timeout": timeout,
            "command_timeout": command_timeout,
        }
        self.size = size
        self.timeout = timeout
        self._idle: list[tuple[Any, int]] = []  # (connection, generation), most recent last
        self._waiters: deque[asyncio.Future[Any]] = deque()
        self._open = 0
        self._generation = 0
        self._closed = False

    @property
    def open(self) -> int:
        """Connections open now (idle and in use)."""
        return self._open

    async def acquire(self) -> Any:
        """An open connection; raises ``TimeoutError`` when none frees up within
        ``timeout``, the driver's error when a new one cannot be opened."""
        if self._closed:
            raise PoolClosedError("the connection pool is closed")
        while self._idle:
            conn, generation = self._idle.pop()
            if generation == self._generation and not conn.is_closed():
                return conn
            self._discard(conn)
        if self._open < self.size:
            return await self._connect()
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        self._waiters.append(waiter)
        expiry = loop.call_later(self.timeout, _expire, waiter)  # cheaper than a timeout scope
        try:
            conn = await waiter
        except BaseException:
            if not waiter.done():
                waiter.cancel()
            elif not waiter.cancelled() and waiter.exception() is None:
                given = waiter.result()  # handed to us just as we gave up: pass it on
                if given is None:
                    self._wake_for_new()
                else:
                    self._hand_back(given)
            raise
        finally:
            expiry.cancel()
        return conn if conn is not None else await self._connect()

    async def _connect(self) -> Any:
        import asyncpg

        self._open += 1
        try:
            return await asyncpg.connect(**self._connect_args)
        except BaseException:
            self._open -= 1
            self._wake_for_new()
            raise

    def release(self, conn: Any) -> None:
        """Hand ``conn`` back: to the next waiter, or idle."""
        self._hand_back(conn)

    def discard(self, conn: Any, *, outage: bool) -> None:
        """Close ``conn`` instead of keeping it (a statement cut short, or storage failing);
        ``outage``: retire the idle connections opened before this failure too."""
        if outage:
            self._generation += 1
        self._discard(conn)

    def _hand_back(self, conn: Any) -> None:
        if self._closed or conn.is_closed():
            self._discard(conn)
            return
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        self._idle.append((conn, self._generation))

    def _discard(self, conn: Any) -> None:
        self._open -= 1
        if not conn.is_closed():
            conn.terminate()
        self._wake_for_new()

    def _wake_for_new(self) -> None:
        """A slot freed up: the next waiter opens a connection of its own (``None``)."""
        if self._closed:
            return
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def close(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn, _generation in idle:
            self._open -= 1
            with suppress(Exception):
                await conn.close(timeout=2)
            if not conn.is_closed():
                conn.terminate()
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(PoolClosedError("the connection pool is closed"))
