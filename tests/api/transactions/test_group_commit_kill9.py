"""Hostile review of the create's group commit: ``kill -9`` of the server (its whole process
group, the embedded acquirer host with it) while claim and finish batches are in flight, on
both backends; then a restart on the same database and acquirer store, and every key sent
again.

The load is built to put the batch's corner cases in the same transactions: each key is sent
twice at once (two claims of one key, often in one batch: the second sees the first's
uncommitted row), and every UUID is used by two merchants (one primary key each). Every
answer must be true (tests/api/transactions/truthful_answers.py; SPEC §2, §3.1–3.3, §8): a
201 is the lookup's transaction, a 503 left no claim and sent no 0200, a 409 retried gets
the real outcome, an unanswered create (the kill) is 200 or 404, never stuck; after the
leases no key is processing; one transaction per (merchant, key) and at most one 0200 each,
the acquirer's net approvals the approved transactions.
"""

from __future__ import annotations

import asyncio
import contextlib
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
from tests.support.client import body, card, post_create

pytestmark = pytest.mark.server

UUIDS = 40  # x 2 merchants x 2 sends each = 160 creates at once
# a quarter of the keys' 0200s are answered late (5 s, not in doubt, and waited for): at the
# kill, their claims are committed and their creates unanswered, whatever the load
SLOW_ENV = {
    "IDEMPAY_ACQUIRER_SLOW_SECONDS": "5",
    "IDEMPAY_ACQUIRER_TIMEOUT": "8",
    "IDEMPAY_ANSWER_WITHIN": "10",
}
SLOW, FAST = "tok_issuer_slow", "tok_visa_4242"
KILL_AFTER = 4  # 201s received before the kill: claims and finishes are mid-flight by then


def test_kill9_mid_batches_then_every_key_again_is_truthful(private_backend: Backend) -> None:
    backend = private_backend
    server = backend.server(**SLOW_ENV)
    names = [f"gc-kill9-a-{backend.name}", f"gc-kill9-b-{backend.name}"]
    api_keys, merchants = zip(*(new_merchant(backend, name) for name in names), strict=True)
    uuids = [str(uuid.uuid4()) for _ in range(UUIDS)]
    plan = [
        (m, n, key, body(amount=100 + 2 * n + m, card=card(SLOW if n % 4 == 0 else FAST)))
        for n, key in enumerate(uuids)
        for m in range(2)
        for _twice in range(2)
    ]

    async def run() -> list[httpx.Response | BaseException]:
        limits = httpx.Limits(max_connections=len(plan))
        async with httpx.AsyncClient(base_url=server.url, timeout=30, limits=limits) as client:
            tasks = [
                asyncio.ensure_future(post_create(client, api_keys[m], key, p))
                for m, _n, key, p in plan
            ]
            created = 0
            for next_done in asyncio.as_completed(tasks):
                with contextlib.suppress(Exception):
                    created += (await next_done).status_code == 201
                if created >= KILL_AFTER:
                    break
            await asyncio.to_thread(server.kill)  # SIGKILL to the process group
            return list(await asyncio.gather(*tasks, return_exceptions=True))

    results = asyncio.run(run())
    sends = [
        Sent(merchants[m], api_keys[m], key, payload, result)
        for (m, _n, key, payload), result in zip(plan, results, strict=True)
    ]
    print(backend.name, "answers", response_summary(sends))
    answered = [s for s in sends if s.status is not None]
    assert sum(s.status == 201 for s in answered) >= KILL_AFTER
    assert any(s.status is None for s in sends), response_summary(sends)
    for sent in answered:
        assert_shape(sent, {201, 202, 409, 503})
    assert_not_stored(backend, [s for s in sends if s.status == 503])
    # each (merchant, key) was created at most once among the answers
    created: dict[tuple[str, str], int] = {}
    for sent in answered:
        if sent.status == 201 and sent.response.headers.get("Idempotency-Status") == "created":
            created[sent.ident] = created.get(sent.ident, 0) + 1
    assert all(count == 1 for count in created.values()), created

    again = [s for s in sends if s.status in (None, 409, 503)]
    restarted = assert_truthful_after_restart(backend, sends, again)
    rows = backend.sql('SELECT merchant_id, id FROM "transaction"')
    assert len(rows) == len({(r[0], r[1]) for r in rows})
    restarted.stop()
