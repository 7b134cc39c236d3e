"""Numeric header and query text is parsed strictly, in one place (api/headers.py): only
ASCII digits within a length bound are a number. ``str.isdigit()`` is also true for "²"
(latin-1 0xB2, which a server decodes a header byte as), and ``int()`` refuses it: a
``Prefer: wait=²`` was a 500 on create, lookup and abort, before the API key was read.
Contract §2.8: a malformed ``Prefer`` is ignored, so each is answered as without it."""

from __future__ import annotations

import string

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from api.headers import parse_capped_seconds, parse_non_negative_int, parse_positive_int
from api.idempotency.waiters import preferred_wait
from tests.api.conftest import Deployment
from tests.support.client import Api, assert_problem, body, new_key

# Header bytes as a client can send them; the server decodes them as latin-1.
HOSTILE_WAITS = [
    b"wait=\xb2",  # ²
    b"wait=\xb3",  # ³
    b"wait=\xb9",  # ¹
    b"wait=1\xb2",
    b"wait=\xc2\xb2",  # ² in UTF-8
    b"wait=\xd9\xa1",  # Arabic-Indic one in UTF-8
    b"wait=\xa05",  # NBSP before the digit
    b"wait=+5",
    b"wait=-5",
    b"wait=1e3",
    b"wait=0x10",
    b"wait=5.0",
    b"wait=1_0",
    b"wait=" + b"9" * 5000,
]


def _send(api: Api, method: str, path: str, prefer: bytes, api_key: str | None) -> httpx.Response:
    headers: dict[str, str | bytes] = {"Prefer": prefer}
    if api_key is not None:
        headers["Authorization"] = f"Bearer {api_key}"
    with api.client() as client:
        return client.request(method, path, headers=headers)


@pytest.mark.parametrize("prefer", HOSTILE_WAITS, ids=lambda value: repr(value)[:24])
def test_a_malformed_prefer_wait_is_ignored_on_create_lookup_and_abort(
    deployment: Deployment, prefer: bytes
) -> None:
    api = deployment.a
    key = new_key()
    with api.client() as client:
        headers: dict[str, str | bytes] = {**api.headers(key), "Prefer": prefer}
        created = client.post("/v1/transactions", json=body(), headers=headers)
    assert created.status_code == 201, created.text
    assert "preference-applied" not in created.headers

    looked = _send(api, "GET", f"/v1/transactions/{key}", prefer, api.api_key)
    assert looked.status_code == 200, looked.text
    assert looked.json()["id"] == key
    assert "preference-applied" not in looked.headers

    aborted = _send(api, "POST", f"/v1/transactions/{new_key()}/abort", prefer, api.api_key)
    assert aborted.status_code == 200, aborted.text
    assert aborted.json()["status"] == "aborted"
    assert "preference-applied" not in aborted.headers


@pytest.mark.parametrize("prefer", HOSTILE_WAITS[:3], ids=lambda value: repr(value)[:24])
@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/transactions"),
        ("GET", "/v1/transactions/00000000-0000-4000-8000-000000000000"),
        ("POST", "/v1/transactions/00000000-0000-4000-8000-000000000000/abort"),
    ],
)
def test_a_malformed_prefer_wait_without_an_api_key_is_401(
    deployment: Deployment, prefer: bytes, method: str, path: str
) -> None:
    response = _send(deployment.a, method, path, prefer, None)
    assert_problem(response, 401, "unauthorized")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", 0),
        ("7", 7),
        ("007", 7),
        ("123456", 123456),
        ("", None),
        ("²", None),
        ("¹²³", None),
        ("١٢", None),  # Arabic-Indic digits: int() would take them
        ("５", None),  # fullwidth
        (" 5", None),
        ("5 ", None),
        ("5\n", None),
        ("+5", None),
        ("-5", None),
        ("1_000", None),
        ("1e3", None),
        ("0x10", None),
        ("5.0", None),
        ("1234567", None),  # over max_digits=6
    ],
)
def test_non_negative_int_takes_only_ascii_digits_within_the_bound(
    text: str, expected: int | None
) -> None:
    assert parse_non_negative_int(text, max_digits=6) == expected
    assert parse_non_negative_int(text.encode(), max_digits=6) == expected


def test_positive_int_refuses_zero() -> None:
    assert parse_positive_int("0") is None
    assert parse_positive_int("000") is None
    assert parse_positive_int("1") == 1
    assert parse_positive_int(None) is None


def test_capped_seconds_caps_long_digit_strings_and_refuses_the_rest() -> None:
    assert parse_capped_seconds("5", cap=20) == 5
    assert parse_capped_seconds("21", cap=20) == 20
    assert parse_capped_seconds("9" * 5000, cap=20) == 20
    assert parse_capped_seconds("0", cap=20) == 0
    assert parse_capped_seconds("²", cap=20) is None
    assert parse_capped_seconds("-1", cap=20) is None


@given(st.text(max_size=40) | st.binary(max_size=40))
def test_numeric_parsers_never_raise_and_accept_only_ascii_digits(text: str | bytes) -> None:
    as_text = text.decode("latin-1") if isinstance(text, bytes) else text
    digits = bool(as_text) and all(char in string.digits for char in as_text)
    for value in (
        parse_non_negative_int(text),
        parse_positive_int(text),
        parse_capped_seconds(text, cap=20),
    ):
        assert value is None or (digits and value >= 0)
    if digits and len(as_text) <= 18:
        assert parse_non_negative_int(text) == int(as_text)


@given(st.text(max_size=60), st.sampled_from(["", "wait=", "respond-async, wait=", "wait="]))
def test_preferred_wait_never_raises(text: str, prefix: str) -> None:
    seconds = preferred_wait([prefix + text], 20)
    assert 0 <= seconds <= 20


@given(st.text(st.characters(blacklist_characters=',;"'), max_size=60))
def test_preferred_wait_honours_only_ascii_digit_values(text: str) -> None:
    seconds = preferred_wait(f"wait={text}", 20)
    if not (text and all(char in string.digits for char in text.strip(" \t"))):
        assert seconds == 0
