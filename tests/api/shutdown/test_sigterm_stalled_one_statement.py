"""Review s7b: SIGTERM while a create's ONE statement is slow (``PgInline.create`` sends it
alone: no batch) — here a trigger that sleeps on the key's insert; in production a commit
waiting on a synchronous standby, an I/O stall.

Session 7's ``answer_in_flight`` (6aa9ca5) answers, 7 s after SIGTERM, only creates inside
``GroupCommit``; a create whose statement is sent alone is left to uvicorn, which cancels it
when its 10 s grace ends and answers a bare ``text/plain`` ``500 Internal Server Error`` (no
problem+json, no ``code``, no ``Idempotency-Status``). Two ways a create is sent alone:

* ``guarded``: a merchant with the duplicate guard on, group commit ON (the default) —
  ``PgInline.create`` never queues a guarded create (``guard is None and self.group``), so
  every create of a guarded merchant is outside ``answer_in_flight``'s reach;
* ``one_statement``: ``IDEMPAY_PG_GROUP_COMMIT=false`` (known from 6aa9ca5's scope;
  confirmed here).

Contract §2: every error is RFC 9457 ``application/problem+json`` with a machine-readable
``code``; every response to create carries ``Idempotency-Status``. The same stall in a batch
is answered 409 ``request_in_progress`` problem+json (review_s7's
test_sigterm_while_a_batch_stalls, a plain test since 6aa9ca5).

Seen on 6aa9ca5 (both cases): the create answered ``500`` "Internal Server Error" (bare
text, no problem+json) after SIGTERM; both cases xfailed in two runs out of two. Pass since
session 7's ``waiting.before_exit`` (every create, batched or alone, answered 409 in flight 7 s
after SIGTERM if its work has not ended).

Real server (one worker), private Postgres database with its own stalling trigger.
"""

from __future__ import annotations

import os
import signal
import uuid

import pytest

from tests.support.backend import Backend
from tests.support.client import body
from tests.support.stalls import assert_refused_per_contract, install_stall, stalled_create

pytestmark = pytest.mark.server


@pytest.mark.parametrize("case", ["guarded", "one_statement"])
def test_stalled_alone_create_at_sigterm_is_answered_per_contract(
    private_pg_backend: Backend, case: str
) -> None:
    backend = private_pg_backend
    slow = str(uuid.uuid4())
    merchant = f"review-s7b-{case}"
    api_key = backend.api_key(merchant)
    install_stall(backend, {slow: 14.0})
    if case == "guarded":
        backend.sql("UPDATE merchant SET duplicate_guard_s = 300 WHERE name = :n", n=merchant)
    env = {"IDEMPAY_PG_GROUP_COMMIT": "false"} if case == "one_statement" else {}
    server = backend.server(**env)

    async def sigterm() -> None:
        os.killpg(server.pid, signal.SIGTERM)

    answer = stalled_create(backend, server, api_key, slow, body(amount=3), then=sigterm)
    assert server.proc is not None
    server.proc.wait(30)
    assert_refused_per_contract(answer)
