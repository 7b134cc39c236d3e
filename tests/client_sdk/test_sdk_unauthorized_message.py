"""A 401 tells an SDK user which `api_key` the server refused — the one the client was
given, by the first 8 characters `idempay admin list-keys` shows — and never the whole key,
nor the server's advice to raw HTTP callers ("Send Authorization: Bearer <api key>."), which
an SDK user did send. The server's own text stays in ``detail``."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TypeVar

import httpx
import pytest

from api.auth import unauthorized
from api.errors import problem_body
from client_sdk import AsyncClient, Client, UnauthorizedError
from client_sdk._exceptions import error_from_response

CARD = {"token": "tok_visa_4242", "last4": "4242", "brand": "visa"}
REVOKED = "idp_Zq3vX9revokedKeyForTheTestOnly0123456789ab"
SERVER_DETAIL = unauthorized().detail
_C = TypeVar("_C", Client, AsyncClient)


def _refuse(request: httpx.Request) -> httpx.Response:
    """What the real server answers a key it does not know (api.auth's 401)."""
    error = unauthorized()
    return httpx.Response(
        401,
        content=problem_body(error.status, error.code, error.detail),
        headers={"Content-Type": "application/problem+json", "X-Request-Id": "req_1"},
    )


def _refused(kind: type[_C], tmp_path: Path) -> _C:
    """A client of ``kind`` with the revoked key, on a server that answers 401 to all."""
    return kind(
        "http://idempay.test",
        REVOKED,
        terminal_id="T-0001",
        journal=tmp_path / "pos.db",
        transport=httpx.MockTransport(_refuse),
    )


def _assert_names_the_key(error: UnauthorizedError, api_key: str, shown: str) -> None:
    message = str(error)
    assert message == error.message
    assert message.startswith("401 unauthorized: ")
    assert "api_key" in message and shown in message, message
    assert "Send Authorization" not in message and "Bearer" not in message
    if len(api_key) > 8:
        assert api_key not in message  # never the whole key
    assert error.detail == SERVER_DETAIL  # the server's words are kept
    assert (error.status, error.code, error.request_id) == (401, "unauthorized", "req_1")


def test_the_server_detail_is_what_the_sdk_used_to_repeat() -> None:
    assert "Send Authorization: Bearer" in SERVER_DETAIL


def test_a_purchase_and_a_lookup_name_the_refused_key(tmp_path: Path) -> None:
    with _refused(Client, tmp_path) as client:
        with pytest.raises(UnauthorizedError) as sale:
            client.purchase(amount=1250, currency="BRL", card=CARD)
        _assert_names_the_key(sale.value, REVOKED, "(idp_Zq3v…)")
        with pytest.raises(UnauthorizedError) as lookup:
            client.lookup("0b7e2a1c-6f1d-4c55-9a3e-1d2f3a4b5c6d")
        _assert_names_the_key(lookup.value, REVOKED, "(idp_Zq3v…)")


@pytest.mark.parametrize(
    ("api_key", "shown"),
    [("", "(an empty string)"), ("idp_short", "(9 characters long: not a whole key)")],
)
def test_an_empty_or_truncated_key_is_called_what_it_is(
    tmp_path: Path, api_key: str, shown: str
) -> None:
    with (
        Client(
            "http://idempay.test",
            api_key,
            terminal_id="T-0001",
            journal=tmp_path / "pos.db",
            transport=httpx.MockTransport(_refuse),
        ) as client,
        pytest.raises(UnauthorizedError) as caught,
    ):
        client.abort("0b7e2a1c-6f1d-4c55-9a3e-1d2f3a4b5c6d")
    _assert_names_the_key(caught.value, api_key, shown)


def test_the_async_client_names_the_refused_key(tmp_path: Path) -> None:
    async def sell() -> UnauthorizedError:
        async with _refused(AsyncClient, tmp_path) as client:
            try:
                await client.purchase(amount=1250, currency="BRL", card=CARD)
            except UnauthorizedError as error:
                return error
        raise AssertionError("no 401 raised")

    _assert_names_the_key(asyncio.run(sell()), REVOKED, "(idp_Zq3v…)")


def test_an_error_built_without_a_client_still_speaks_of_the_api_key() -> None:
    """``error_from_response`` (no client at hand: an offline callback's error) says
    `api_key`, not the server's HTTP advice."""
    error = error_from_response(
        401,
        {"x-request-id": "req_1"},
        {"type": "urn:idempay:problem:unauthorized", "title": "Missing or unknown API key",
         "status": 401, "detail": SERVER_DETAIL, "code": "unauthorized"},
    )  # fmt: skip
    assert isinstance(error, UnauthorizedError)
    assert "the api_key this client was given" in str(error)
    assert "Send Authorization" not in str(error)
    assert error.detail == SERVER_DETAIL
