"""SIGTERM while 120 creates are in flight (claims committing, 0200s out at the acquirer,
finishes committing; nothing held): every create the server accepted is answered, and every
answer is true (contract §2, §2.9, §3.1, §3.3) — checked after a restart on the same
database and acquirer store (tests/api/transactions/truthful_answers.py): a 201 is what the
lookup shows, a 202 ends terminal by itself, a 409 retried gets the real outcome, a 503 left
nothing stored and no 0200 sent, no key stays processing after its lease, the acquirer saw
at most one 0200 per key and its net approvals are the approved transactions. A create
whose connection uvicorn closed unanswered may be processed or not: its lookup is 200 or
404, never stuck; nothing is written that was not sent.

Where the group-commit create answered every accepted create 201, the claim/finish path
has two more contract answers here: 202 (the 0210 took longer than
``IDEMPAY_ANSWER_WITHIN``) and 409 (a create still at work 7 s into uvicorn's 10 s grace is
answered in flight by the app, ``waiting.before_exit``; its work goes on).

``server``: SIGTERM to the server process alone, as an orchestrator stops it. The acquirer
host stays up until the server has drained (``idempay serve`` stops its child after
uvicorn returns), so no create is refused (503) and none is settled in doubt: every 201
is the acquirer's own approval.
``process_group``: SIGTERM to the whole process group, as a terminal's Ctrl-C or
``kill -- -PGID`` does. The embedded acquirer host shares the server's process group and
stops at once itself: a create whose 0200 had not left is answered 503 with its claim
released — nothing was processed, true (§2.9, "a 0200 that provably never left … the
create answers 503 and the key is released"); one whose 0200 was out is in doubt and ends
declined / acquirer_timeout with its reversal advice queued (acknowledged after the restart).
"""

from __future__ import annotations

import asyncio
import os
import signal
import uuid

import httpx
import pytest

from tests.api.transactions.truthful_answers import (
    Sent,
    assert_not_stored,
    assert_shape,
    assert_truthful_after_restart,
    new_merchant,
    response_summary,
)
from tests.support.backend import Backend
from tests.support.client import body, post_create

pytestmark = pytest.mark.server


@pytest.mark.parametrize("target", ["server", "process_group"])
def test_sigterm_answers_every_accepted_create_truthfully(
    private_pg_backend: Backend, target: str
) -> None:
    backend = private_pg_backend
    server = backend.server()
    name = f"sigterm-drain-{target}"
    api_key, merchant = new_merchant(backend, name)
    keys = [str(uuid.uuid4()) for _ in range(120)]
    payloads = [body(amount=100 + n) for n in range(len(keys))]

    async def run() -> list[httpx.Response | BaseException]:
        limits = httpx.Limits(max_connections=120)
        async with httpx.AsyncClient(base_url=server.url, timeout=30, limits=limits) as client:
            tasks = [
                asyncio.ensure_future(post_create(client, api_key, key, payloads[n]))
                for n, key in enumerate(keys)
            ]
            # the first answer: creates are being claimed, sent and finished, more in flight
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            if target == "server":
                os.kill(server.pid, signal.SIGTERM)
            else:
                os.killpg(server.pid, signal.SIGTERM)
            return list(await asyncio.gather(*tasks, return_exceptions=True))

    results = asyncio.run(run())
    assert server.proc is not None
    server.proc.wait(30)
    sends = [
        Sent(merchant, api_key, key, payload, result)
        for key, payload, result in zip(keys, payloads, results, strict=True)
    ]
    print(target, "answers", response_summary(sends))
    answered = [s for s in sends if s.status is not None]
    assert answered
    allowed = {201, 202, 409} if target == "server" else {201, 202, 409, 503}
    for sent in answered:
        assert_shape(sent, allowed)
    if target == "server":  # the acquirer answered every 0200 that left: none in doubt
        for sent in answered:
            if sent.status == 201:
                assert sent.response.json()["status"] == "approved", sent.response.text
    assert_not_stored(backend, [s for s in sends if s.status == 503])

    assert_truthful_after_restart(backend, sends, [s for s in sends if s.status in (409, 503)])
