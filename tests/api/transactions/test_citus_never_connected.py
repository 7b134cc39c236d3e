"""The Citus coordinator's ERROR for a worker it could not connect to is a rollback: the
statement never reached the worker (a create of a merchant whose worker is down answers 503,
nothing processed). The same SQLSTATE for a connection that broke once open is an unknown
outcome (the worker may have committed before it went: 409, look the key up). The messages
are Citus's own, as a coordinator answered them with a worker stopped (Citus 13)."""

from __future__ import annotations

import asyncpg
import pytest

from api.storage_errors import citus_never_connected, end_unseen

NODE = "connection to the remote node postgres@127.0.0.1:30363 failed with the following error: "


def _error(message: str, *, sqlstate: str = "08006", severity: str = "ERROR") -> BaseException:
    fields = {"S": severity, "V": severity, "C": sqlstate, "M": message}
    return asyncpg.exceptions.PostgresError.new(fields)  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    "reason",
    [
        "Connection refused\n\tIs the server running on that host and accepting TCP/IP"
        " connections?",
        'could not translate host name "worker-9" to address: Name or service not known',
        "No route to host",
        "FATAL:  the database system is starting up",
        "FATAL:  the database system is shutting down",
        "FATAL:  sorry, too many clients already",
    ],
)
def test_a_worker_never_reached_is_a_rollback(reason: str) -> None:
    error = _error(NODE + reason)
    assert citus_never_connected(error)
    assert not end_unseen(error)


@pytest.mark.parametrize(
    "error",
    [
        _error(NODE + "server closed the connection unexpectedly"),
        _error(NODE + "FATAL:  terminating connection due to administrator command"),
        _error("connection to server was lost"),
        _error(NODE + "Connection refused", severity="FATAL"),  # our own session ended
        _error("terminating connection due to administrator command", sqlstate="57P01"),
    ],
)
def test_a_connection_that_broke_once_open_stays_unseen(error: BaseException) -> None:
    assert not citus_never_connected(error)
    assert end_unseen(error)
