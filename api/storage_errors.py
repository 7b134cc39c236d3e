"""Exceptions that mean "the database is unreachable right now" (answered 503)."""

from __future__ import annotations

import asyncpg
import sqlalchemy.exc


class StorageUnavailableError(ConnectionError):
    """The database could not take the write now (connection lost, refused, disk full):
    answered 503, and nothing was acknowledged — a retry with the same key is safe."""


def storage_unavailable(exc: BaseException) -> bool:
    """True for "the database cannot serve us now" (connect refused, pool exhausted, too many
    clients, connection lost, a primary demoted under us): answered 503, retry-safe.
    Constraint violations and other statement errors are bugs, not outages, and stay 500.
    One judgement for both paths: SQLAlchemy's wrapped errors and the hot path's raw
    asyncpg errors (its key reads, ``api.db.DriverPool``)."""
    if isinstance(exc, STORAGE_ERRORS):
        return True
    if isinstance(exc, sqlalchemy.exc.DBAPIError):
        if exc.connection_invalidated or exc.statement is None:
            return True
        orig = exc.orig
        if citus_commit_unseen(getattr(orig, "__cause__", None) or orig):
            return True
        return _sqlstate(orig).startswith(UNAVAILABLE_SQLSTATES)
    return _sqlstate(exc).startswith(UNAVAILABLE_SQLSTATES) or citus_commit_unseen(exc)


def end_unseen(exc: BaseException) -> bool:
    """For a storage error met while a statement ran (``storage_unavailable``): True when it
    does not prove the statement rolled back — the connection lost or reset mid-statement, or
    the server ending the session (a FATAL error: 57P01 admin_shutdown, 57P02
    crash_shutdown), which may come after the commit record reached the WAL (a wait for a
    synchronous standby cut short, a crash right after the commit). False for an ERROR the
    server answered for the statement (a read-only node, a resource limit, a cancel): the
    statement's transaction was rolled back, nothing of it committed."""
    if not isinstance(exc, asyncpg.PostgresError):
        return True  # the client's side: connection closed, reset, left mid-operation
    if getattr(exc, "severity", None) in ("FATAL", "PANIC"):
        return True
    if citus_never_connected(exc):
        return False
    return _sqlstate(exc).startswith(("08", "57P")) or citus_commit_unseen(exc)


# The Citus coordinator's ERROR (08006) for a worker it could not connect to: the statement
# never reached the worker, so nothing of it can have committed there (a worker that is down,
# or still starting, or refusing sessions). A connection that broke once open says "server
# closed the connection unexpectedly", or a FATAL of a running session ("terminating
# connection …"), instead: the worker may have committed before it went — unseen.
CITUS_NEVER_CONNECTED = (
    "failed with the following error: Connection refused",
    "failed with the following error: could not translate host name",
    "failed with the following error: No route to host",
    # the worker's postmaster refusing a new session (libpq: "FATAL:  <message>")
    "the database system is starting up",
    "the database system is shutting down",
    "the database system is not yet accepting connections",
    "the database system is in recovery mode",
    "sorry, too many clients already",
)


def citus_never_connected(exc: BaseException) -> bool:
    """True for the coordinator's answer that it could not open a connection to the worker
    (above): a rollback, not an unknown outcome."""
    if _sqlstate(exc) != "08006" or getattr(exc, "severity", None) != "ERROR":
        return False
    first_line = str(exc).split("\n", 1)[0]
    return first_line.startswith("connection to the remote node") and any(
        message in first_line for message in CITUS_NEVER_CONNECTED
    )


# Citus commits a single-shard transaction on the worker from the coordinator's COMMIT; when
# the worker's answer is lost after its commit record was durable there, Citus WARNs and
# answers the client's COMMIT with a plain ERROR (XX000) with one of these messages: the
# transaction may well have committed on the worker.
CITUS_COMMIT_UNSEEN = (
    "could not commit transaction for shard",
    "failed to commit transaction on",
)


def citus_commit_unseen(exc: BaseException | None) -> bool:
    """True for Citus's ERROR at COMMIT whose worker's answer was lost (above): not a
    rollback — the outcome is unknown, like a connection lost mid-COMMIT."""
    if exc is None or _sqlstate(exc) != "XX000":
        return False
    text = str(exc)
    return any(message in text for message in CITUS_COMMIT_UNSEEN)


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
