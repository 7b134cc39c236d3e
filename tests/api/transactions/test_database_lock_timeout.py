"""Review s7 (Postgres group commit and the one-statement path alike; fixed by e4ffda8): with a
``lock_timeout`` set on the database (or the role: an operator's safety setting — 7a5e65f
relies on the pool's connections keeping the server's setting), a create whose key another
transaction holds past that timeout is answered 500 ``internal_error`` ("Internal error;
nothing was stored under the key") with ``Idempotency-Status: not_found``: its batch gives up
on its own 500 ms lock wait and falls back, and the create's own statement (``CREATE``, no
lock wait of its own) raises ``LockNotAvailableError`` (55P03), which
``storage_unavailable`` does not count and ``PgInline`` treats as a bug.

Contract §2: the create answers are the table's — the key being written by someone else
now is 409 ``request_in_progress`` (``Retry-After``; ``Idempotency-Status: in_progress``),
storage unavailable is 503; a lock wait that ran out is neither a bug nor "nothing stored
under the key" for certain (the holder may commit it). Seen on d3dafde with the database's
``lock_timeout = '2s'``: 500 ``internal_error`` at 2.5 s (group commit) and at 2.0 s with
``IDEMPAY_PG_GROUP_COMMIT=false``. Passes since e4ffda8 (the one-statement CREATE has a
lock wait of its own, 500 ms, shorter than the database's, and a held key is answered 409):
kept to guard the fix.

Real server (one worker), private Postgres database (its own ``ALTER DATABASE``; dropped
with it); the holder is a plain transaction with an uncommitted row of the key.
"""

from __future__ import annotations

import asyncio
import uuid

import httpx
import pytest

from tests.api.transactions.truthful_answers import new_merchant
from tests.support.backend import Backend
from tests.support.client import body
from tests.support.stalls import dsn, held_key

pytestmark = pytest.mark.server


def test_key_held_past_the_databases_lock_timeout(private_pg_backend: Backend) -> None:
    backend = private_pg_backend
    assert backend.database_url is not None
    name = backend.database_url.rsplit("/", 1)[1]
    backend.sql(f"ALTER DATABASE \"{name}\" SET lock_timeout = '2s'")
    server = backend.server()
    api_key, merchant_id = new_merchant(backend, "review-s7-locktimeout")
    held = str(uuid.uuid4())

    async def run() -> httpx.Response:
        async with (
            held_key(dsn(backend), merchant_id, held, server_settings={"lock_timeout": "0"}),
            httpx.AsyncClient(base_url=server.url, timeout=60) as client,
        ):
            return await client.post(
                "/v1/transactions",
                json=body(amount=5),
                headers={"Authorization": f"Bearer {api_key}", "Idempotency-Key": held},
            )

    answer = asyncio.run(run())
    assert answer.status_code in (409, 503), (answer.status_code, answer.text)
    assert answer.headers.get("Retry-After") is not None
