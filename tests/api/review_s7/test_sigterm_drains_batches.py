"""Review s7 (Postgres group commit): held edge, plain test. SIGTERM while creates are queued
and in batches (nothing held): every create the server accepted is answered 201 and
written, nothing answered 5xx, and nothing is written that was not sent (a create whose
connection uvicorn closed unanswered may be written or not: a retry replays) — the writers
finish what is queued before the worker exits (``GroupCommit.close``), the lifespan closes
them after the last request (contract §3.1, §3.3: nothing acknowledged is lost).
"""

from __future__ import annotations

import asyncio
import os
import signal
import uuid

import httpx
import pytest

from tests.support.backend import Backend
from tests.support.client import body

pytestmark = pytest.mark.server


def test_sigterm_answers_and_writes_every_accepted_create(private_pg_backend: Backend) -> None:
    backend = private_pg_backend
    server = backend.server()
    api_key = backend.api_key("review-s7-drain")
    keys = [str(uuid.uuid4()) for _ in range(120)]

    async def run() -> list[httpx.Response | BaseException]:
        limits = httpx.Limits(max_connections=120)
        async with httpx.AsyncClient(base_url=server.url, timeout=30, limits=limits) as client:

            async def post(n: int, key: str) -> httpx.Response:
                return await client.post(
                    "/v1/transactions",
                    json=body(amount=100 + n),
                    headers={"Authorization": f"Bearer {api_key}", "Idempotency-Key": key},
                )

            tasks = [asyncio.ensure_future(post(n, key)) for n, key in enumerate(keys)]
            # the first answer: creates are being written, more are queued and in flight
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            os.killpg(server.pid, signal.SIGTERM)
            return list(await asyncio.gather(*tasks, return_exceptions=True))

    results = asyncio.run(run())
    assert server.proc is not None
    server.proc.wait(30)
    answered = {
        key: r for key, r in zip(keys, results, strict=True) if isinstance(r, httpx.Response)
    }
    assert answered
    assert {r.status_code for r in answered.values()} == {201}
    written = {row[0] for row in backend.sql('SELECT id FROM "transaction"')}
    assert set(answered) <= written  # every acknowledged create is there
    assert written <= set(keys)
    ledger = backend.sql("SELECT count(*) FROM ledger_entry")[0][0]
    assert ledger == len(written)
