"""Exceptions that mean "the database is unreachable right now" (answered 503)."""

from __future__ import annotations

import asyncpg
import sqlalchemy.exc


def storage_unavailable(exc: BaseException) -> bool:
    """True for "the database cannot serve us now" (connect refused, pool exhausted, too many
    clients, connection lost, a primary demoted under us): answered 503, retry-safe.
    Constraint violations and other statement errors are bugs, not outages, and stay 500.
    One judgement for both paths: SQLAlchemy's wrapped errors and the one-write path's raw
    asyncpg errors."""
    if isinstance(exc, STORAGE_ERRORS):
        return True
    if isinstance(exc, sqlalchemy.exc.DBAPIError):
        if exc.connection_invalidated or exc.statement is None:
            return True
        return _sqlstate(exc.orig).startswith(UNAVAILABLE_SQLSTATES)
    return _sqlstate(exc).startswith(UNAVAILABLE_SQLSTATES)


def misconfigured(exc: BaseException) -> bool:
    """True for a connection refused for good rather than for now: bad credentials
    (SQLSTATE class 28) or a database that does not exist (3D000). Waiting will not help."""
    orig = exc.orig if isinstance(exc, sqlalchemy.exc.DBAPIError) else exc
    return _sqlstate(orig).startswith(MISCONFIGURED_SQLSTATES)


MISCONFIGURED_SQLSTATES = ("28", "3D")


# Connection exception, insufficient resources, operator intervention (shutdown, crash,
# cannot connect now), and a read-only transaction: the node we reach was demoted (failover).
UNAVAILABLE_SQLSTATES = ("08", "53", "57", "25006")


def _sqlstate(orig: BaseException | None) -> str:
    """The SQLSTATE behind a driver error (asyncpg via SQLAlchemy's adapter), or ""."""
    for candidate in (orig, getattr(orig, "__cause__", None)):
        code = getattr(candidate, "sqlstate", None) or getattr(candidate, "pgcode", None)
        if isinstance(code, str):
            return code
    return ""


STORAGE_ERRORS: tuple[type[BaseException], ...] = (
    sqlalchemy.exc.OperationalError,
    sqlalchemy.exc.InterfaceError,
    sqlalchemy.exc.TimeoutError,
    sqlalchemy.exc.DisconnectionError,
    ConnectionError,
    OSError,
    TimeoutError,
    # asyncpg's client side: a connection closed, or left mid-operation (seen as
    # InternalClientError during a Patroni switchover)
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
)
