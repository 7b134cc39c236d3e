"""Exceptions that mean "the database is unreachable right now" (answered 503)."""

from __future__ import annotations

import sqlalchemy.exc

STORAGE_ERRORS: tuple[type[BaseException], ...] = (
    sqlalchemy.exc.OperationalError,
    sqlalchemy.exc.InterfaceError,
    sqlalchemy.exc.TimeoutError,
    sqlalchemy.exc.DisconnectionError,
    ConnectionError,
    OSError,
    TimeoutError,
)
