"""Review s7 (Postgres group commit): held edge, plain test. Keys fenced earlier — one by
abort before anything arrived, one expired (``expires_at`` already passed) — re-sent many
times at once, the same body and another, batched with fresh creates: every re-send is
answered 410 with its fence (``transaction_aborted`` / ``request_expired``,
``Idempotency-Status: aborted`` / ``expired``), nothing is ever written under them, and the
fresh creates batched with them are answered 201 (contract §2: abort, 410 rows).
"""

from __future__ import annotations

import asyncio
import uuid

import httpx
import pytest

from tests.support.backend import Backend
from tests.support.client import body

pytestmark = pytest.mark.server


def test_fenced_keys_resent_inside_batches(private_pg_backend: Backend) -> None:
    backend = private_pg_backend
    server = backend.server()
    api_key = backend.api_key("review-s7-fenced")
    aborted, expired = str(uuid.uuid4()), str(uuid.uuid4())
    late = body(amount=71, expires_at="2020-01-01T00:00:00Z")

    async def run() -> tuple[list[httpx.Response], list[httpx.Response], list[httpx.Response]]:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:

            def headers(key: str) -> dict[str, str]:
                return {"Authorization": f"Bearer {api_key}", "Idempotency-Key": key}

            fence = await client.post(f"/v1/transactions/{aborted}/abort", headers=headers(aborted))
            assert fence.status_code == 200 and fence.json()["status"] == "aborted"
            first = await client.post("/v1/transactions", json=late, headers=headers(expired))
            assert first.status_code == 410 and first.json()["code"] == "request_expired"

            def post(key: str, payload: dict[str, object]) -> asyncio.Future[httpx.Response]:
                return asyncio.ensure_future(
                    client.post("/v1/transactions", json=payload, headers=headers(key))
                )

            a = [post(aborted, body(amount=70 + n % 2)) for n in range(8)]
            e = [post(expired, late if n % 2 else body(amount=72)) for n in range(8)]
            fresh = [post(str(uuid.uuid4()), body(amount=300 + n)) for n in range(16)]
            return (
                list(await asyncio.gather(*a)),
                list(await asyncio.gather(*e)),
                list(await asyncio.gather(*fresh)),
            )

    on_aborted, on_expired, fresh = asyncio.run(run())
    assert {
        (r.status_code, r.json()["code"], r.headers["Idempotency-Status"]) for r in on_aborted
    } == {(410, "transaction_aborted", "aborted")}
    assert {
        (r.status_code, r.json()["code"], r.headers["Idempotency-Status"]) for r in on_expired
    } == {(410, "request_expired", "expired")}
    assert [r.status_code for r in fresh] == [201] * len(fresh)
    written = backend.sql(
        'SELECT count(*) FROM "transaction" WHERE id IN (:a, :e)', a=aborted, e=expired
    )
    assert written == [(0,)]
    states = dict(
        backend.sql(
            "SELECT key, state FROM idempotency_key WHERE key IN (:a, :e)", a=aborted, e=expired
        )
    )
    assert states == {aborted: "aborted", expired: "expired"}
