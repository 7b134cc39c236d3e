"""Review s7 (Postgres group commit): held edges, plain tests.

- The same keys from two workers at once, in different batches, with a different payload
  among the re-sends, and another merchant using the same UUIDs at the same moment (its own
  keys, contract §2 "Authentication and tenancy"): each (merchant, key) is processed once
  (one transaction, one ledger entry, one issuer record), exactly one caller per key gets
  201 ``created``, every other caller of the same payload gets the identical body as a
  replay and every caller of the other payload 422 ``idempotency_key_reused`` (contract §2,
  §3.1–3.2) — never a 5xx or a 409. Declines and refunds ride the same batches: a declined
  create is stored and replayed like an approval and has no ledger entry.
- A completed key's row locked by an operator's open ``SELECT … FOR UPDATE`` does not stop
  its batch: the replay (and the creates batched with it) are answered at once
  (``ON CONFLICT DO NOTHING`` does not wait on a row lock, only on a writer).
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from typing import Any

import asyncpg
import httpx
import pytest

from tests.support.backend import Backend
from tests.support.client import body, card

pytestmark = pytest.mark.server


def test_same_keys_from_two_workers_in_different_batches(private_pg_backend: Backend) -> None:
    backend = private_pg_backend
    server = backend.server(workers=2)
    merchants = {name: backend.api_key(name) for name in ("review-s7-share", "review-s7-twin")}
    ids = dict(backend.sql("SELECT name, id FROM merchant"))
    keys = [str(uuid.uuid4()) for _ in range(30)]
    sends = []
    for m, name in enumerate(merchants):
        sends += [(name, key, 1000 * (m + 1) + n) for n, key in enumerate(keys) for _ in range(3)]
        sends += [(name, key, 5000 * (m + 1) + n) for n, key in enumerate(keys)]  # other body
    random.Random(7).shuffle(sends)

    async def run() -> list[tuple[tuple[str, str], int, httpx.Response]]:
        limits = httpx.Limits(max_connections=40)
        async with httpx.AsyncClient(base_url=server.url, timeout=30, limits=limits) as client:

            async def post(
                name: str, key: str, amount: int
            ) -> tuple[tuple[str, str], int, httpx.Response]:
                payload = body(amount=amount)
                if amount % 5 == 0:  # declined by the issuer
                    payload["card"] = card("tok_decline_insufficient_funds")
                elif amount % 7 == 0:
                    payload["type"] = "refund"
                response = await client.post(
                    "/v1/transactions",
                    json=payload,
                    headers={"Authorization": f"Bearer {merchants[name]}", "Idempotency-Key": key},
                )
                return (ids[name], key), amount, response

            return await asyncio.gather(*(post(*send) for send in sends))

    results = asyncio.run(run())
    by_key: dict[tuple[str, str], list[tuple[int, httpx.Response]]] = {}
    for ident, amount, response in results:
        by_key.setdefault(ident, []).append((amount, response))
    rows = {
        (r[0], r[1]): r[2:]
        for r in backend.sql(
            "SELECT t.merchant_id, t.id, t.amount, (SELECT count(*) FROM ledger_entry l"
            " WHERE l.merchant_id = t.merchant_id AND l.transaction_id = t.id),"
            ' (SELECT count(*) FROM "transaction" u WHERE u.merchant_id = t.merchant_id'
            ' AND u.id = t.id) FROM "transaction" t'
        )
    }
    issuer = backend.sql("SELECT count(*) FROM issuer_authorization")[0][0]
    assert sorted(rows) == sorted(by_key)
    assert len(rows) == 2 * len(keys)
    assert issuer == len(rows)
    for key, answers in by_key.items():
        amount, ledger, copies = rows[key]
        assert (ledger, copies) == (0 if amount % 5 == 0 else 1, 1), key
        created = [r for a, r in answers if r.headers.get("Idempotency-Status") == "created"]
        assert len(created) == 1, [(a, r.status_code) for a, r in answers]
        assert created[0].status_code == 201 and created[0].json()["amount"] == amount
        declined = created[0].json()["status"] == "declined"
        assert declined == (amount % 5 == 0)
        for sent, response in answers:
            if response is created[0]:
                continue
            if sent == amount:
                assert response.status_code == 201, response.text
                assert response.headers.get("Idempotent-Replayed") == "true"
                assert response.content == created[0].content
            else:
                assert response.status_code == 422, response.text
                assert response.json()["code"] == "idempotency_key_reused"


def test_row_locked_for_update_does_not_hold_its_batch(private_pg_backend: Backend) -> None:
    backend = private_pg_backend
    server = backend.server()
    api_key = backend.api_key("review-s7-forupdate")
    assert backend.database_url is not None
    dsn = backend.database_url.replace("+asyncpg", "")
    locked = str(uuid.uuid4())

    async def run() -> tuple[float, list[httpx.Response]]:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:

            def post(key: str, amount: int) -> Any:
                return client.post(
                    "/v1/transactions",
                    json=body(amount=amount),
                    headers={"Authorization": f"Bearer {api_key}", "Idempotency-Key": key},
                )

            first = await post(locked, 321)
            assert first.status_code == 201
            operator = await asyncpg.connect(dsn)
            tx = operator.transaction()
            await tx.start()
            try:
                await operator.execute(
                    "SELECT * FROM idempotency_key WHERE key = $1 FOR UPDATE", locked
                )
                started = time.monotonic()
                answers = await asyncio.gather(
                    post(locked, 321), *(post(str(uuid.uuid4()), 400 + n) for n in range(8))
                )
                return time.monotonic() - started, [first, *answers]
            finally:
                await tx.rollback()
                await operator.close()

    waited, (first, replay, *others) = asyncio.run(run())
    assert waited < 1.0
    assert replay.status_code == 201 and replay.headers.get("Idempotent-Replayed") == "true"
    assert replay.content == first.content
    assert [r.status_code for r in others] == [201] * len(others)
