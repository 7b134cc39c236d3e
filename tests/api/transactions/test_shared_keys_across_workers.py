"""The same keys sent to two server workers at once, with a different body among the
re-sends, and another merchant using the same UUIDs at the same moment (its own keys,
contract §2 "Authentication and tenancy"); then a completed key's row locked by an operator.

- Each (merchant, key) is processed once: one claim wins, one 0200 reaches the acquirer,
  one transaction, one ledger entry when approved (none when declined; refunds and
  declines are processed and stored like approvals). Exactly one caller per key gets the
  creator's answer — 201 ``created``, or 202 if the acquirer's 0210 took longer than
  ``IDEMPAY_ANSWER_WITHIN`` (then the key ends by itself and the lookup is 200). Every other
  caller of the same body gets the identical body as a replay, or 409
  ``request_in_progress`` whose retry gets that replay; every caller of the other body 422
  ``idempotency_key_reused``, or 409 whose retry gets the 422. Never a 5xx: storage and
  the acquirer are up.
  Why 409 is now right (the replaced one-write create never answered it): the claim
  commits the key as ``processing`` before its 0200 leaves, and the answer can only be
  written after the 0210 (contract §2.9); a duplicate arriving in that window finds the key
  in flight — §3.2: "concurrent duplicates never both execute: the losers get 409 or the
  replay".
- A completed key's row locked by an operator's open ``SELECT … FOR UPDATE`` holds neither
  its replay nor the creates sent with it: the replay is a plain read, a new key's claim
  (``ON CONFLICT DO NOTHING``) waits only on a writer of the same key.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from typing import Any

import httpx
import pytest

from tests.api.transactions.truthful_answers import (
    Sent,
    assert_acquirer,
    assert_retried_truthful,
    assert_shape,
    merchant_id,
    response_summary,
)
from tests.support.backend import Backend
from tests.support.client import body, card, post_create
from tests.support.stalls import dsn, held

pytestmark = pytest.mark.server


def _payload(amount: int) -> dict[str, Any]:
    payload = body(amount=amount)
    if amount % 5 == 0:  # declined by the acquirer
        payload["card"] = card("tok_decline_insufficient_funds")
    elif amount % 7 == 0:
        payload["type"] = "refund"
    return payload


def test_same_keys_from_two_workers_at_once(private_pg_backend: Backend) -> None:
    backend = private_pg_backend
    server = backend.server(workers=2)
    names = ("shared-keys-a", "shared-keys-b")
    api_keys = {name: backend.api_key(name) for name in names}
    ids = {name: merchant_id(backend, name) for name in names}
    keys = [str(uuid.uuid4()) for _ in range(30)]
    plan = []
    for m, name in enumerate(names):
        plan += [(name, key, 1000 * (m + 1) + n) for n, key in enumerate(keys) for _ in range(3)]
        plan += [(name, key, 5000 * (m + 1) + n) for n, key in enumerate(keys)]  # other body
    random.Random(7).shuffle(plan)

    async def run() -> list[Sent]:
        limits = httpx.Limits(max_connections=40)
        async with httpx.AsyncClient(base_url=server.url, timeout=30, limits=limits) as client:

            async def post(name: str, key: str, amount: int) -> Sent:
                payload = _payload(amount)
                response = await post_create(client, api_keys[name], key, payload)
                return Sent(ids[name], api_keys[name], key, payload, response)

            return await asyncio.gather(*(post(*send) for send in plan))

    sends = asyncio.run(run())
    print("answers", response_summary(sends))
    for sent in sends:
        assert_shape(sent, {201, 202, 409, 422})
    assert_retried_truthful(server.url, backend, sends, [s for s in sends if s.status == 409])

    by_key: dict[tuple[str, str], list[Sent]] = {}
    for sent in sends:
        by_key.setdefault(sent.ident, []).append(sent)
    assert len(by_key) == 2 * len(keys)
    stored = {
        (r[0], r[1]): (r[2], r[3])
        for r in backend.sql('SELECT merchant_id, id, amount, status FROM "transaction"')
    }
    assert set(stored) == set(by_key)  # each merchant's own key processed, once
    for ident, answers in by_key.items():
        amount, status = stored[ident]
        assert (status == "declined") == (amount % 5 == 0), (ident, amount, status)
        creators = [
            s
            for s in answers
            if s.status == 202 or s.response.headers.get("Idempotency-Status") == "created"
        ]
        assert len(creators) == 1, [(s.payload["amount"], s.status) for s in answers]
        assert creators[0].payload["amount"] == amount
    assert_acquirer(backend, set(by_key))


def test_row_locked_for_update_holds_neither_its_replay_nor_other_creates(
    private_pg_backend: Backend,
) -> None:
    backend = private_pg_backend
    server = backend.server()
    api_key = backend.api_key("shared-keys-forupdate")
    locked = str(uuid.uuid4())

    async def run() -> tuple[float, list[httpx.Response]]:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:

            def post(key: str, amount: int) -> Any:
                return post_create(client, api_key, key, body(amount=amount))

            first = await post(locked, 321)
            assert first.status_code == 201
            locking = "SELECT * FROM idempotency_key WHERE key = $1 FOR UPDATE"
            async with held(dsn(backend), locking, locked):  # an operator's open transaction
                started = time.monotonic()
                answers = await asyncio.gather(
                    post(locked, 321), *(post(str(uuid.uuid4()), 400 + n) for n in range(8))
                )
                return time.monotonic() - started, [first, *answers]

    waited, (first, replay, *others) = asyncio.run(run())
    assert waited < 1.0
    assert replay.status_code == 201 and replay.headers.get("Idempotent-Replayed") == "true"
    assert replay.content == first.content
    assert [r.status_code for r in others] == [201] * len(others)
