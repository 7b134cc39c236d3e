"""contract §3.1–3.2: concurrent duplicates never both execute; abort vs create has one winner.

Every request goes over its own pooled HTTP connection to a real server, and every winner
commits for real; the database is then checked row by row, and the acquirer's store (its
child host's) RRN by RRN: at most one 0200 per key, and its net approvals are exactly the
approved transactions (contract §3.8).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from api.acquirer.host.store import net_approvals, summary
from api.acquirer.messages import rrn_for
from api.config import Settings
from tests.api.conftest import Deployment
from tests.support.backend import Backend
from tests.support.client import Api, body

KEYS = 200
DUPLICATES = 20


@pytest.fixture(scope="module")
def racing(backend: Backend) -> Iterator[Deployment]:
    """A server that lets 100 concurrent requests queue for its connection pool instead of
    shedding load with 503 (what it would do in production after IDEMPAY_DB_TIMEOUT), and
    for the acquirer's answer instead of answering 202 (after IDEMPAY_ANSWER_WITHIN) or
    settling the key in doubt (after IDEMPAY_ACQUIRER_TIMEOUT): on a loaded machine the
    claimer still answers its terminal itself."""
    server = backend.server(
        IDEMPAY_DB_TIMEOUT="120", IDEMPAY_ANSWER_WITHIN="100", IDEMPAY_ACQUIRER_TIMEOUT="90"
    )
    api = Api(server.url, backend.api_key(f"merchant-race-{backend.name}"))
    yield Deployment(backend, server, api, api)
    server.stop()


@dataclass(frozen=True)
class Answer:
    status_code: int
    headers: dict[str, str]
    content: bytes

    def json(self) -> Any:
        return json.loads(self.content)


async def _fire(deployment: Deployment, calls: list[tuple[str, str]]) -> list[Answer]:
    """All calls at once over up to 100 connections (aiohttp: httpx's pool is the bottleneck
    at this concurrency)."""
    connector = aiohttp.TCPConnector(limit=100)
    headers = {"Authorization": f"Bearer {deployment.a.api_key}"}
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(
        deployment.a.base_url, connector=connector, headers=headers, timeout=timeout
    ) as client:

        async def one(kind: str, key: str) -> Answer:
            if kind == "create":
                request = client.post(
                    "/v1/transactions",
                    json=body(terminal_id="T-RACE", amount=500),
                    headers={"Idempotency-Key": key},
                )
            else:
                request = client.post(f"/v1/transactions/{key}/abort")
            async with request as response:
                content = await response.read()
                lowered = {k.lower(): v for k, v in response.headers.items()}
                return Answer(response.status, lowered, content)

        return await asyncio.gather(*(one(kind, key) for kind, key in calls))


def _acquirer(deployment: Deployment, keys: list[str]) -> tuple[dict[str, int], set[str]]:
    """Per key, the 0200s the acquirer received (0: never asked), and the keys it approved
    and did not reverse."""
    merchant_id = deployment.backend.sql(
        "SELECT merchant_id FROM api_key WHERE key_hash = :h",
        h=hashlib.sha256(deployment.a.api_key.encode()).hexdigest(),
    )[0][0]
    secret = Settings().secret_key.encode()  # the servers' (IDEMPAY_SECRET_KEY unset)
    rrns = {rrn_for(secret, merchant_id, key): key for key in keys}
    store = deployment.backend.tmp / "var" / "acquirer.sqlite3"
    seen = summary(store)
    requests = {key: seen[rrn].requests if rrn in seen else 0 for rrn, key in rrns.items()}
    return requests, {rrns[rrn] for rrn in net_approvals(store) if rrn in rrns}


def _charges_per_key(deployment: Deployment, keys: list[str]) -> Counter[str]:
    rows = deployment.backend.sql(
        "SELECT transaction_id FROM ledger_entry WHERE kind = 'charge' "
        "AND transaction_id IN (SELECT id FROM \"transaction\" WHERE terminal_id = 'T-RACE')"
    )
    wanted = set(keys)
    return Counter(row[0] for row in rows if row[0] in wanted)


def test_concurrent_identical_creates_execute_exactly_once(racing: Deployment) -> None:
    keys = [str(uuid.uuid4()) for _ in range(KEYS)]
    calls = [("create", key) for key in keys for _ in range(DUPLICATES)]
    random.Random(7).shuffle(calls)
    responses = asyncio.run(_fire(racing, calls))

    by_key: dict[str, list[Answer]] = {}
    for (_, key), response in zip(calls, responses, strict=True):
        by_key.setdefault(key, []).append(response)
    for key, answers in by_key.items():
        created = [r for r in answers if r.headers.get("idempotency-status") == "created"]
        assert len(created) == 1, (key, [r.status_code for r in answers])
        for other in answers:
            if other is created[0]:
                continue
            if other.status_code == 409:
                assert other.json()["code"] == "request_in_progress"
            else:
                assert other.status_code == 201
                assert other.headers["idempotent-replayed"] == "true"
                assert other.content == created[0].content
    charges = _charges_per_key(racing, keys)
    assert set(charges) == set(keys)
    assert set(charges.values()) == {1}
    transactions = racing.backend.sql(
        "SELECT count(*) FROM \"transaction\" WHERE terminal_id = 'T-RACE'"
    )[0][0]
    assert transactions >= KEYS
    requests, approved = _acquirer(racing, keys)
    assert set(requests.values()) == {1}  # one 0200 per key, ever
    assert approved == set(keys)  # every approval there is a transaction here, and back


def test_abort_racing_create_has_exactly_one_winner(racing: Deployment) -> None:
    keys = [str(uuid.uuid4()) for _ in range(KEYS)]
    calls = [(kind, key) for key in keys for kind in ["create", "abort"] * (DUPLICATES // 2)]
    random.Random(11).shuffle(calls)
    responses = asyncio.run(_fire(racing, calls))
    assert all(r.status_code < 500 for r in responses)

    states = dict(
        (row[0], row[1])
        for row in racing.backend.sql(
            "SELECT key, state FROM idempotency_key WHERE merchant_id = "
            "(SELECT merchant_id FROM api_key WHERE key_hash = :h)",
            h=hashlib.sha256(racing.a.api_key.encode()).hexdigest(),
        )
    )
    charges = _charges_per_key(racing, keys)
    with_txn = {
        row[0]
        for row in racing.backend.sql("SELECT id FROM \"transaction\" WHERE terminal_id = 'T-RACE'")
    }
    for key in keys:
        assert states[key] in ("completed", "aborted")
        has_txn = key in with_txn
        assert has_txn == (states[key] == "completed"), key
        assert charges.get(key, 0) == (1 if has_txn else 0)
    for (kind, key), response in zip(calls, responses, strict=True):
        if kind == "abort" and response.status_code == 200:
            expected = "aborted" if states[key] == "aborted" else "approved"
            assert response.json()["status"] == expected
        if kind == "create" and states[key] == "aborted":
            assert response.status_code in (409, 410)
    # an aborted key was never sent; a processed one was sent once and approved
    requests, approved = _acquirer(racing, keys)
    for key in keys:
        assert requests[key] == (1 if states[key] == "completed" else 0), key
    assert approved == {key for key in keys if states[key] == "completed"}
