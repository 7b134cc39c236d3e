"""Review s7 (Postgres group commit, def0de0; this setup fixed by e4ffda8): SIGTERM while
a failed batch's create waits alone on its key.

The create's batch gave up on another transaction's lock of its key (500 ms) and the create
was sent again in a task of its own (``GroupCommit._answer_one``). On SIGTERM uvicorn waits
``timeout_graceful_shutdown`` (10 s) for the request, then cancels it: the terminal is
answered a bare ``text/plain`` ``500 Internal Server Error`` — no problem+json, no ``code``,
no ``Idempotency-Status``, no ``Retry-After``. The alone task is not cancelled with it:
``GroupCommit.close`` (the lifespan's shutdown) waits for it, so when the other transaction
ends the create is written and committed during shutdown — processed after its caller was
told 500, and with no request event for it (seen: the key ``completed`` with its
transaction, ``request_event`` empty for the key).

Contract §2: every error is RFC 9457 problem+json with a machine-readable ``code``; every
response to create carries ``Idempotency-Status``; a 503 (storage) or 409 (the key is being
processed) carries ``Retry-After``. Not group commit's own: this test with
``IDEMPAY_PG_GROUP_COMMIT=false`` (one statement per create, waiting on the same holder)
saw the same bare 500 (d3dafde). Seen on d3dafde: the 500 at ~11.4 s after the create was
sent (SIGTERM at ~1.2 s), the write at the holder's rollback (~13 s), the process gone
right after. Passes since e4ffda8: the held key's create is answered 409 ``request_in_progress``
(problem+json, ``Retry-After``) after 500 ms, before the SIGTERM — no create outlasts the
grace period here; kept to guard that. test_sigterm_while_a_batch_stalls keeps the same
failure without a lock wait (xfail).

Real server (one worker), private Postgres database; the holder is a plain transaction with
an uncommitted row of the key (an operator's open transaction, a stuck writer).
"""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from typing import Any

import httpx
import pytest

from tests.api.transactions.truthful_answers import new_merchant
from tests.support.backend import Backend
from tests.support.client import body, post_create
from tests.support.stalls import (
    WAITING,
    admin,
    assert_refused_per_contract,
    dsn,
    held_key,
    until_seen,
)

pytestmark = pytest.mark.server

GRACE_S = 10  # api/cli.py: uvicorn's timeout_graceful_shutdown


def test_create_waiting_alone_at_sigterm_is_answered_per_contract(
    private_pg_backend: Backend,
) -> None:
    backend = private_pg_backend
    server = backend.server()
    api_key, merchant_id = new_merchant(backend, "review-s7-term")
    held = str(uuid.uuid4())

    async def run() -> tuple[httpx.Response, list[httpx.Response]]:
        async with (
            admin(backend) as watch,
            held_key(dsn(backend), merchant_id, held),
            httpx.AsyncClient(base_url=server.url, timeout=60) as client,
        ):

            def post(key: str, amount: int) -> Any:
                return post_create(client, api_key, key, body(amount=amount))

            waiting = asyncio.create_task(post(held, 77))
            others = [asyncio.create_task(post(str(uuid.uuid4()), 100 + n)) for n in range(3)]
            await until_seen(
                watch,
                WAITING,
                what="the held key's create waiting on its holder",
                within=10,
                interval=0.02,
            )
            answered = await asyncio.gather(*others)  # batched with it: answered at once
            await asyncio.sleep(0.7)  # past the batch's lock wait: the create waits alone
            os.killpg(server.pid, signal.SIGTERM)
            answer = await asyncio.wait_for(waiting, GRACE_S + 20)
            return answer, answered

    answer, others = asyncio.run(run())
    assert [r.status_code for r in others] == [201, 201, 201]
    assert_refused_per_contract(answer)
    assert answer.headers.get("Retry-After") is not None
