"""Exceptions that mean "the database is unreachable right now" (answered 503)."""

from __future__ import annotations

import sqlalchemy.exc


def storage_unavailable(exc: BaseException) -> bool:
    """True for "the database cannot serve us now" (connect refused, pool exhausted, too many
    clients, connection lost): answered 503, retry-safe. Constraint violations and other
    statement errors are bugs, not outages, and stay 500."""
    if isinstance(exc, STORAGE_ERRORS):
        return True
    if isinstance(exc, sqlalchemy.exc.DBAPIError):
        return exc.connection_invalidated or exc.statement is None
    return False


STORAGE_ERRORS: tuple[type[BaseException], ...] = (
    sqlalchemy.exc.OperationalError,
    sqlalchemy.exc.InterfaceError,
    sqlalchemy.exc.TimeoutError,
    sqlalchemy.exc.DisconnectionError,
    ConnectionError,
    OSError,
    TimeoutError,
)
