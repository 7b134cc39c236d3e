"""SIGTERM while one create's claim is stalled in Postgres (here a trigger that sleeps on
that key's INSERT; in production a commit waiting on a synchronous standby, an I/O stall).

- The stalled claim holds no other create: creates of other keys sent while it sleeps are
  claimed, authorized and answered at once (201; 202 if the acquirer's 0210 is later than
  ``IDEMPAY_ANSWER_WITHIN``): claims are group-committed, and a batch still running after
  ``group_commit.STALL_S`` frees its lane, so the creates queued behind the stalled one get
  a lane of their own (a committer that kept them in the stalled batch's queue made all of
  them wait for it, and at SIGTERM every one was answered 409 in flight).
- uvicorn waits ``timeout_graceful_shutdown`` (10 s) for the requests, then would cancel
  them with a bare ``text/plain`` 500. The stalled create is answered by the app before
  that (``waiting.before_exit``, 7 s after SIGTERM): 409 ``request_in_progress``,
  problem+json, ``Idempotency-Status: in_progress``, ``Retry-After`` — contract §2: every
  error is problem+json with a ``code``, every create answer carries ``Idempotency-Status``.
- That 409 is true whatever the stalled statement does next (commits during the shutdown,
  or is rolled back with the process): after a restart on the same database and acquirer
  store, a retry with the key gets the real outcome, the key does not stay processing after
  its lease, the acquirer saw at most one 0200 for it, and every 201 is what the lookup
  shows (tests/api/transactions/truthful_answers.py).

Real server (one worker) stopped by SIGTERM to its process alone (the acquirer host stays
up until the server has drained), private Postgres database with its own stalling trigger.
"""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from typing import Any

import httpx
import pytest

from tests.api.transactions.truthful_answers import (
    Sent,
    assert_shape,
    assert_truthful_after_restart,
    new_merchant,
)
from tests.support.backend import Backend
from tests.support.client import body, post_create
from tests.support.stalls import SLEEPING, admin, install_stall, start_stalled, stop_stalling

pytestmark = pytest.mark.server


def test_a_stalled_claim_at_sigterm_is_answered_in_flight_and_holds_no_other_create(
    private_pg_backend: Backend,
) -> None:
    backend = private_pg_backend
    slow = str(uuid.uuid4())
    others = [str(uuid.uuid4()) for _ in range(3)]
    install_stall(backend, {slow: 14.0})
    server = backend.server()
    api_key, merchant = new_merchant(backend, "sigterm-claim-stall")
    payloads = {slow: body(amount=3)} | {key: body(amount=10 + n) for n, key in enumerate(others)}

    async def run() -> tuple[httpx.Response, list[httpx.Response], int]:
        async with (
            admin(backend) as watch,
            httpx.AsyncClient(base_url=server.url, timeout=60) as client,
        ):

            def post(key: str) -> Any:
                return asyncio.ensure_future(post_create(client, api_key, key, payloads[key]))

            stalled = await start_stalled(
                watch,
                post_create(client, api_key, slow, payloads[slow]),
                what="the slow key's claim stalling",
            )
            answered = list(await asyncio.gather(*(post(key) for key in others)))
            # the slow claim still sleeps: it held none of them
            still = int(await watch.fetchval(SLEEPING))
            os.kill(server.pid, signal.SIGTERM)
            return await stalled, answered, still

    stalled, answered, still = asyncio.run(run())
    assert server.proc is not None
    server.proc.wait(30)
    assert still == 1
    sends = [Sent(merchant, api_key, slow, payloads[slow], stalled)] + [
        Sent(merchant, api_key, key, payloads[key], r)
        for key, r in zip(others, answered, strict=True)
    ]
    for sent in sends[1:]:  # answered while the slow claim still sleeps: not held by it
        assert_shape(sent, {201, 202})  # 202: a loaded host's 0210 later than the answer time
        if sent.status == 201:
            assert sent.response.json()["status"] == "approved"
    assert_shape(sends[0], {409})

    stop_stalling(backend)  # the retry's claim does not stall
    assert_truthful_after_restart(backend, sends, [sends[0]])
