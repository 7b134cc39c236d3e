"""Review s7b: SIGINT twice (an operator's Ctrl-C, then Ctrl-C again — uvicorn's "force
exit") while a create's batch statement is slow (a trigger that sleeps on the key's insert;
in production a commit waiting on a synchronous standby, an I/O stall). Group commit on
(the default), one worker.

The second SIGINT makes uvicorn skip its graceful wait: the create still waiting on its
statement is answered at once a bare ``text/plain`` ``500 Internal Server Error`` — no
problem+json, no ``code``, no ``Idempotency-Status`` — and no request event is logged for
it. Session 7's ``answer_in_flight`` (6aa9ca5) only runs 7 s after the first signal, so it
never answers this create. (The worker then exits with the statement uncommitted: nothing
is written, so a retry is safe; the answer's form and the missing event are what break.)

Contract §2: every error is RFC 9457 ``application/problem+json`` with a machine-readable
``code``; every response to create carries ``Idempotency-Status``. SIGTERM twice is
answered per contract (409 ``request_in_progress`` problem+json 7 s after the first,
written, event ``in_progress``/409; seen in one exploratory run) — only SIGINT's second
signal forces the exit.

Seen on 6aa9ca5: 500 ``text/plain; charset=utf-8`` "Internal Server Error" ~1.1 s after
the first SIGINT (0.1 s after the second), no transaction row, no request event. Now the
second SIGINT answers the creates at work in flight at once and the shutdown goes on
gracefully (its lifespan flushes the events); a third would force the exit
(``api/main.py``, ``_close_waiters_on_exit_signal``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import uuid

import pytest

from tests.support.backend import Backend
from tests.support.client import body
from tests.support.stalls import assert_refused_per_contract, install_stall, stalled_create

pytestmark = pytest.mark.server


def test_create_in_flight_at_sigint_twice_is_answered_per_contract(
    private_pg_backend: Backend,
) -> None:
    backend = private_pg_backend
    slow = str(uuid.uuid4())
    api_key = backend.api_key("review-s7b-sigint")
    install_stall(backend, {slow: 14.0})
    server = backend.server()

    async def sigint_twice() -> None:
        os.killpg(server.pid, signal.SIGINT)
        await asyncio.sleep(1.0)
        os.killpg(server.pid, signal.SIGINT)

    answer = stalled_create(backend, server, api_key, slow, body(amount=3), then=sigint_twice)
    assert server.proc is not None
    server.proc.wait(40)
    assert_refused_per_contract(answer)
    events = backend.sql(
        "SELECT outcome, http_status FROM request_event WHERE idempotency_key = :k", k=slow
    )
    assert len(events) == 1, events
