"""Review s7 (Postgres group commit and the one-statement path alike): the replay of a
completed key whose row another transaction is updating (an operator's open ``BEGIN;
UPDATE idempotency_key …``, a backfill migration's transaction during a rolling deploy)
waits on that transaction — ``ON CONFLICT DO NOTHING`` waits for an in-progress updater of
the conflicting row (not for a ``FOR UPDATE`` locker: test_batches_share_keys) — first in its
batch (500 ms, then the batch falls back), then alone.

Contract §2: same key, same payload, already processed → 201 with
``Idempotent-Replayed: true`` and the identical body (the stored answer is readable without
waiting); never 503 (storage is up: the creates batched with it are answered 201 in
~0.5 s), nor ``Idempotency-Status: not_found`` / 409 ``request_in_progress`` for a key
whose answer is committed.

On d3dafde: 503 "Storage unavailable; nothing was processed" at 30.5 s (asyncpg's
``command_timeout``) with ``Idempotency-Status: not_found`` (30.0 s with
``IDEMPAY_PG_GROUP_COMMIT=false``). On 181d98c it passed (594d7b4/b8e38b7: after the timeout
the keys are read and the replay is answered, ~30 s). Since e4ffda8 (every create's own
statement waits on a lock at most 500 ms, then 409): 409 ``request_in_progress`` after
1.0 s — docs/contract.md's decision (f96492d) speaks of a key held by "its uncommitted row";
this key's row is committed, its answer readable, and SPEC §2 answers a processed key with
its replay.

Real server (one worker), private Postgres database.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import httpx
import pytest

from tests.support.backend import Backend
from tests.support.client import body, post_create
from tests.support.stalls import dsn, held

pytestmark = pytest.mark.server


def test_replay_while_another_transaction_updates_the_key_row(
    private_pg_backend: Backend,
) -> None:
    backend = private_pg_backend
    server = backend.server()
    api_key = backend.api_key("review-s7-updated")
    key = str(uuid.uuid4())

    async def run() -> tuple[httpx.Response, httpx.Response, float, list[httpx.Response]]:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:

            def post(key: str, amount: int) -> Any:
                return post_create(client, api_key, key, body(amount=amount))

            first = await post(key, 11)
            assert first.status_code == 201
            updating = "UPDATE idempotency_key SET updated_at = updated_at WHERE key = $1"
            async with held(dsn(backend), updating, key):  # an operator's open transaction
                started = time.monotonic()
                replay = asyncio.create_task(post(key, 11))
                others = await asyncio.gather(*(post(str(uuid.uuid4()), 20 + n) for n in range(3)))
                answer = await asyncio.wait_for(replay, 45)
                return first, answer, time.monotonic() - started, others

    first, replay, waited, others = asyncio.run(run())
    assert [r.status_code for r in others] == [201, 201, 201]
    assert replay.status_code == 201, (round(waited, 2), replay.status_code, replay.headers)
    assert replay.headers.get("Idempotent-Replayed") == "true"
    assert replay.content == first.content
