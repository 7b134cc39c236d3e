"""A thin test client for the HTTP API (the SDK is tested on its own)."""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass
from typing import Any

import httpx

from tests.support.eventually import eventually

CARD = {"token": "tok_visa_4242", "last4": "4242", "brand": "visa"}


def new_key() -> str:
    return str(uuid.uuid4())


def body(**overrides: Any) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "terminal_id": "T-0001",
        "amount": 1250,
        "currency": "BRL",
        "card": dict(CARD),
    }
    payload.update(overrides)
    return payload


def card(token: str) -> dict[str, str]:
    return {**CARD, "token": token}


async def post_create(
    client: httpx.AsyncClient, api_key: str, key: str, payload: Any
) -> httpx.Response:
    """One create on ``client`` (a server's base URL), as the merchant of ``api_key``."""
    return await client.post(
        "/v1/transactions",
        json=payload,
        headers={"Authorization": f"Bearer {api_key}", "Idempotency-Key": key},
    )


@dataclass
class Api:
    base_url: str
    api_key: str

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, timeout=30.0)

    def headers(self, key: str | None, api_key: str | None = None, **extra: str) -> dict[str, str]:
        headers = {"Authorization": f"Bearer {api_key or self.api_key}", **extra}
        if key is not None:
            headers["Idempotency-Key"] = key
        return headers

    def create(
        self, key: str | None, payload: Any = None, *, api_key: str | None = None, **headers: str
    ) -> httpx.Response:
        with self.client() as client:
            return client.post(
                "/v1/transactions",
                json=body() if payload is None else payload,
                headers=self.headers(key, api_key, **headers),
            )

    def lookup(self, key: str, *, api_key: str | None = None) -> httpx.Response:
        with self.client() as client:
            return client.get(f"/v1/transactions/{key}", headers=self.headers(None, api_key))

    def abort(self, key: str, *, api_key: str | None = None) -> httpx.Response:
        with self.client() as client:
            return client.post(f"/v1/transactions/{key}/abort", headers=self.headers(None, api_key))

    def reverse(self, key: str, *, api_key: str | None = None) -> httpx.Response:
        with self.client() as client:
            return client.post(
                f"/v1/transactions/{key}/reversal", headers=self.headers(None, api_key)
            )


def assert_problem(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    problem = response.json()
    assert problem["code"] == code
    assert problem["status"] == status
    assert problem["type"] and problem["title"] and problem["detail"]
    assert response.headers.get("x-request-id")
    return problem  # type: ignore[no-any-return]


def slow_create_in_flight(
    api: Api, key: str, *, seen_by: Api | None = None
) -> tuple[threading.Thread, list[httpx.Response]]:
    """``key``'s create with tok_issuer_slow sent by ``api`` on a thread of its own, once
    ``seen_by`` (``api`` by default) looks it up in flight (202): the thread, and the list
    its answer lands in."""
    created: list[httpx.Response] = []
    original = threading.Thread(
        target=lambda: created.append(api.create(key, body(card=card("tok_issuer_slow"))))
    )
    original.start()
    looking = seen_by or api
    eventually(lambda: looking.lookup(key).status_code == 202, what="the key in flight")
    return original, created
