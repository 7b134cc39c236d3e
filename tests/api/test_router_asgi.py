"""The transaction routes in process (issue 15, the fast lane): the real app built by
``create_app`` — lifespan, middleware, lean create route, error handlers — on an embedded
SQLite file, driven over ``httpx.ASGITransport``. No server process, no Postgres: the whole
module runs in seconds and in ``make test-fast``. The HTTP contract is docs/contract.md §2;
tests/api/transactions runs the same paths against real servers on both backends."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from api.auth import create_api_key
from api.config import Settings
from tests.support import asgi
from tests.support.asgi import migrated_sqlite
from tests.support.client import assert_problem, body, card, new_key

TRANSACTIONS = "/v1/transactions"


class Merchant:
    """One merchant's API key and the requests of contract §2 made with it."""

    def __init__(self, http: httpx.AsyncClient, api_key: str) -> None:
        self.http = http
        self.api_key = api_key

    def headers(self, key: str | None = None, **extra: str) -> dict[str, str]:
        headers = {"Authorization": f"Bearer {self.api_key}", **extra}
        if key is not None:
            headers["Idempotency-Key"] = key
        return headers

    async def create(self, key: str | None, payload: Any = None, **extra: str) -> httpx.Response:
        return await self.http.post(
            TRANSACTIONS,
            json=body() if payload is None else payload,
            headers=self.headers(key, **extra),
        )

    async def created(self, payload: Any = None) -> tuple[str, httpx.Response]:
        """A create of a new key that must answer 201: the key and the answer."""
        key = new_key()
        response = await self.create(key, payload)
        assert response.status_code == 201, response.text
        return key, response

    async def lookup(self, key: str) -> httpx.Response:
        return await self.http.get(f"{TRANSACTIONS}/{key}", headers=self.headers())

    async def abort(self, key: str) -> httpx.Response:
        return await self.http.post(f"{TRANSACTIONS}/{key}/abort", headers=self.headers())

    async def reverse(self, key: str) -> httpx.Response:
        return await self.http.post(f"{TRANSACTIONS}/{key}/reversal", headers=self.headers())


app, http = asgi.app, asgi.http  # the fixtures, on asgi_settings


@pytest.fixture(scope="module")
def asgi_settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """A migrated SQLite file of this module's own."""
    return migrated_sqlite(tmp_path_factory.mktemp("asgi") / "var")


@pytest.fixture(scope="module")
async def merchant(app: FastAPI, http: httpx.AsyncClient) -> Merchant:
    return Merchant(http, await create_api_key(app.state.ctx.engine, "asgi-merchant-a"))


@pytest.fixture(scope="module")
async def other_merchant(app: FastAPI, http: httpx.AsyncClient) -> Merchant:
    return Merchant(http, await create_api_key(app.state.ctx.engine, "asgi-merchant-b"))


async def test_create_answers_201_with_the_transaction(merchant: Merchant) -> None:
    key, created = await merchant.created(body(amount=4321))
    assert created.headers["idempotency-status"] == "created"
    assert "idempotent-replayed" not in created.headers
    assert created.headers.get("x-request-id")
    transaction = created.json()
    assert transaction["id"] == key
    assert transaction["status"] == "approved"
    assert transaction["amount"] == 4321
    assert transaction["card"] == {"last4": "4242", "brand": "visa"}  # never the token


async def test_replay_answers_201_with_the_identical_body(merchant: Merchant) -> None:
    key, first = await merchant.created()
    replay = await merchant.create(key)
    assert replay.status_code == 201, replay.text
    assert replay.headers["idempotent-replayed"] == "true"
    assert replay.headers["idempotency-status"] == "replayed"
    assert replay.content == first.content


async def test_a_decline_is_processed_and_replayed_like_an_approval(merchant: Merchant) -> None:
    key, declined = await merchant.created(body(card=card("tok_decline_insufficient_funds")))
    assert declined.json()["status"] == "declined"
    assert declined.json()["decline_reason"] == "insufficient_funds"
    replay = await merchant.create(key, body(card=card("tok_decline_insufficient_funds")))
    assert replay.headers["idempotent-replayed"] == "true"
    assert replay.content == declined.content


async def test_lookup_answers_the_transaction_or_404(
    merchant: Merchant, other_merchant: Merchant
) -> None:
    key, created = await merchant.created()
    found = await merchant.lookup(key)
    assert found.status_code == 200, found.text
    assert found.headers["idempotency-status"] == "processed"
    assert found.json() == created.json()
    unknown = await merchant.lookup(new_key())
    assert_problem(unknown, 404, "not_found")
    assert unknown.headers["idempotency-status"] == "not_found"
    # another merchant's key is answered exactly as an unknown one (contract §2.1)
    assert_problem(await other_merchant.lookup(key), 404, "not_found")


async def test_abort_fences_an_unused_key_and_a_later_create_is_410(merchant: Merchant) -> None:
    key = new_key()
    aborted = await merchant.abort(key)
    assert aborted.status_code == 200, aborted.text
    assert aborted.json() == {"id": key, "status": "aborted"}
    assert aborted.headers["idempotency-status"] == "aborted"
    again = await merchant.abort(key)  # repeating it is harmless
    assert again.status_code == 200 and again.json() == {"id": key, "status": "aborted"}
    refused = await merchant.create(key)
    assert_problem(refused, 410, "transaction_aborted")
    assert refused.headers["idempotency-status"] == "aborted"
    assert_problem(await merchant.lookup(key), 410, "transaction_aborted")


async def test_abort_of_a_processed_key_answers_the_transaction(merchant: Merchant) -> None:
    key, created = await merchant.created()
    aborted = await merchant.abort(key)
    assert aborted.status_code == 200, aborted.text
    assert aborted.headers["idempotency-status"] == "processed"
    assert aborted.json() == created.json()  # nothing changed
    assert (await merchant.lookup(key)).json()["status"] == "approved"


async def test_reversal_reverses_once_and_repeats_the_same_answer(
    merchant: Merchant, other_merchant: Merchant
) -> None:
    key, _ = await merchant.created()
    assert_problem(await other_merchant.reverse(key), 404, "not_found")
    reversed_ = await merchant.reverse(key)
    assert reversed_.status_code == 200, reversed_.text
    assert reversed_.json()["status"] == "reversed"
    assert reversed_.json()["reversed_at"]
    repeated = await merchant.reverse(key)
    assert repeated.status_code == 200, repeated.text
    assert repeated.json() == reversed_.json()
    assert (await merchant.lookup(key)).json() == reversed_.json()
    assert_problem(await merchant.reverse(new_key()), 404, "not_found")


async def test_a_declined_transaction_is_not_reversible(merchant: Merchant) -> None:
    key = new_key()
    declined = await merchant.create(key, body(card=card("tok_decline_do_not_honor")))
    assert declined.json()["status"] == "declined"
    assert_problem(await merchant.reverse(key), 422, "not_reversible")


# The 4xx table of contract §2.2: each refusal is problem+json with its code, and nothing is
# stored under the key — the same key with a valid request is then processed afresh.


async def test_a_create_without_an_idempotency_key_is_400(merchant: Merchant) -> None:
    assert_problem(await merchant.create(None), 400, "idempotency_key_missing")


@pytest.mark.parametrize("key", ["not-a-uuid", "1234", "{00000000-0000-4000-8000-000000000000}"])
async def test_a_create_with_an_invalid_idempotency_key_is_400(
    merchant: Merchant, key: str
) -> None:
    assert_problem(await merchant.create(key), 400, "idempotency_key_invalid")


@pytest.mark.parametrize(
    "authorization", [None, "Bearer idp_unknown", "Basic dXNlcjpwYXNz", "Bearer "]
)
async def test_a_missing_or_unknown_api_key_is_401(
    http: httpx.AsyncClient, merchant: Merchant, authorization: str | None
) -> None:
    key = new_key()
    headers = {"Idempotency-Key": key}
    if authorization is not None:
        headers["Authorization"] = authorization
    assert_problem(await http.post(TRANSACTIONS, json=body(), headers=headers), 401, "unauthorized")
    assert_problem(await http.get(f"{TRANSACTIONS}/{key}", headers=headers), 401, "unauthorized")
    assert (await merchant.create(key)).headers["idempotency-status"] == "created"


async def test_the_same_key_with_another_payload_is_422_key_reused(merchant: Merchant) -> None:
    key, first = await merchant.created(body(amount=100))
    assert_problem(await merchant.create(key, body(amount=101)), 422, "idempotency_key_reused")
    assert (await merchant.lookup(key)).json() == first.json()  # the first answer stands


@pytest.mark.parametrize(
    "payload",
    [
        body(amount=0),
        body(amount="12.50"),
        body(currency="brl"),
        body(terminal_id=""),
        body(surprise=True),  # unknown fields are refused
        {"amount": 100},
        [],
    ],
    ids=[
        "amount-0",
        "amount-text",
        "currency-case",
        "terminal-empty",
        "unknown-field",
        "partial",
        "list",
    ],
)
async def test_an_invalid_body_is_422_validation_error(merchant: Merchant, payload: Any) -> None:
    key = new_key()
    problem = assert_problem(await merchant.create(key, payload), 422, "validation_error")
    assert problem["errors"]
    assert (await merchant.create(key)).headers["idempotency-status"] == "created"


async def test_duplicate_object_keys_are_422_validation_error(merchant: Merchant) -> None:
    raw = json.dumps(body())[:-1] + ', "amount": 999}'
    response = await merchant.http.post(
        TRANSACTIONS,
        content=raw.encode(),
        headers=merchant.headers(new_key(), **{"Content-Type": "application/json"}),
    )
    assert_problem(response, 422, "validation_error")


@pytest.mark.parametrize(
    "payload",
    [
        body(metadata={"note": "card 4111111111111111"}),
        body(terminal_id="4111111111111111"),
        body(card={"token": "4111 1111 1111 1111", "last4": "1111", "brand": "visa"}),
    ],
    ids=["metadata", "terminal", "token-spaced"],
)
async def test_a_card_number_anywhere_is_422_pan_not_allowed(
    merchant: Merchant, payload: Any
) -> None:
    key = new_key()
    problem = assert_problem(await merchant.create(key, payload), 422, "pan_not_allowed")
    assert "4111" not in json.dumps(problem)
    assert (await merchant.create(key)).headers["idempotency-status"] == "created"


async def test_a_body_over_16_kib_is_413(merchant: Merchant) -> None:
    key = new_key()
    big = body(metadata={"note": "x" * (17 * 1024)})
    assert_problem(await merchant.create(key, big), 413, "payload_too_large")
    assert (await merchant.create(key)).headers["idempotency-status"] == "created"
