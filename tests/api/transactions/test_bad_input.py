"""Bad input gets its documented 4xx problem and leaves no row behind (contract §2)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.api.conftest import Deployment
from tests.support.client import assert_problem, body, new_key

VISA_PAN = "4111111111111111"


def _no_trace(deployment: Deployment, key: str) -> None:
    assert deployment.count("idempotency_key", key=key) == 0
    assert deployment.count("transaction", id=key) == 0


def _raw(deployment: Deployment, key: str | None, content: bytes, **headers: str) -> httpx.Response:
    with deployment.a.client() as client:
        return client.post(
            "/v1/transactions",
            content=content,
            headers={**deployment.a.headers(key), "Content-Type": "application/json", **headers},
        )


def test_missing_idempotency_key_is_400(deployment: Deployment) -> None:
    response = deployment.a.create(None)
    assert_problem(response, 400, "idempotency_key_missing")
    assert response.headers["idempotency-status"] == "not_found"


@pytest.mark.parametrize(
    "raw",
    [
        "abc",
        "1234",
        "{6f1c4a52-8d1e-4c1e-9a63-2b4f0c6e9d10}",
        "6f1c4a528d1e4c1e9a632b4f0c6e9d10",
        "urn:uuid:6f1c4a52-8d1e-4c1e-9a63-2b4f0c6e9d10",
        "6f1c4a52-8d1e-4c1e-9a63-2b4f0c6e9d1g",
        '"6f1c4a52-8d1e-4c1e-9a63-2b4f0c6e9d10',
        "6f1c4a52-8d1e-4c1e-9a63-2b4f0c6e9d10 x",
    ],
)
def test_non_uuid_idempotency_key_is_400(deployment: Deployment, raw: str) -> None:
    assert_problem(deployment.a.create(raw), 400, "idempotency_key_invalid")


@pytest.mark.parametrize(
    "authorization",
    [None, "", "Bearer", "Bearer nope", "Basic abc", "bearer idp_x", "BEARER idp_y",
     "Bearer " + "x" * 500],
)  # fmt: skip
def test_missing_or_unknown_api_key_is_401(
    deployment: Deployment, authorization: str | None
) -> None:
    key = new_key()
    headers = {"Idempotency-Key": key}
    if authorization is not None:
        headers["Authorization"] = authorization
    with deployment.a.client() as client:
        for response in (
            client.post("/v1/transactions", json=body(), headers=headers),
            client.get(f"/v1/transactions/{key}", headers=headers),
            client.post(f"/v1/transactions/{key}/abort", headers=headers),
            client.post(f"/v1/transactions/{key}/reversal", headers=headers),
        ):
            assert_problem(response, 401, "unauthorized")
    _no_trace(deployment, key)


def test_body_over_16_kib_is_413(deployment: Deployment) -> None:
    key = new_key()
    big = json.dumps(body(metadata={"x": "a" * 17_000})).encode()
    assert_problem(_raw(deployment, key, big), 413, "payload_too_large")

    def chunks() -> Any:
        for _ in range(20):
            yield b" " * 1024  # no Content-Length: chunked transfer

    with deployment.a.client() as client:
        chunked = client.post(
            "/v1/transactions",
            content=chunks(),
            headers={**deployment.a.headers(key), "Content-Type": "application/json"},
        )
    assert_problem(chunked, 413, "payload_too_large")
    _no_trace(deployment, key)


INVALID_BODIES: dict[str, Any] = {
    "unknown field": body(surprise=1),
    "unknown card field": body(
        card={"token": "tok_visa", "last4": "4242", "brand": "visa", "cvv": "123"}
    ),
    "amount zero": body(amount=0),
    "amount negative": body(amount=-5),
    "amount too big": body(amount=10**12 + 1),
    "amount huge": body(amount=10**30),
    "amount float": body(amount=12.5),
    "amount string": body(amount="1250"),
    "amount bool": body(amount=True),
    "amount null": body(amount=None),
    "currency lower": body(currency="brl"),
    "currency long": body(currency="BRLX"),
    "terminal bad chars": body(terminal_id="T 0001"),
    "terminal too long": body(terminal_id="T" * 65),
    "terminal empty": body(terminal_id=""),
    "type unknown": body(type="capture"),
    "installments 0": body(installments=0),
    "installments 25": body(installments=25),
    "captured_at naive": body(captured_at="2026-11-20T12:00:00"),
    "expires_at garbage": body(expires_at="tomorrow"),
    "metadata too big": body(metadata={"note": "x" * 4100}),
    "metadata not object": body(metadata=[1, 2]),
    "card token not tok_": body(card={"token": "visa", "last4": "4242", "brand": "visa"}),
    "card last4 letters": body(card={"token": "tok_v", "last4": "42a2", "brand": "visa"}),
    "missing amount": {k: v for k, v in body().items() if k != "amount"},
    "missing card": {k: v for k, v in body().items() if k != "card"},
    "array body": [body()],
    "string body": "hello",
    "null body": None,
}


@pytest.mark.parametrize("case", list(INVALID_BODIES))
def test_invalid_body_is_422_validation_error(deployment: Deployment, case: str) -> None:
    key = new_key()
    response = _raw(deployment, key, json.dumps(INVALID_BODIES[case]).encode())
    problem = assert_problem(response, 422, "validation_error")
    assert problem["errors"] and all("loc" in err and "msg" in err for err in problem["errors"])
    _no_trace(deployment, key)


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"{",
        b"{'a': 1}",
        b'{"amount": NaN}',
        b'{"amount": Infinity}',
        b"\xff\xfe",
        b"[" * 5000 + b"]" * 5000,
        b'{"amount": 1' + b"0" * 5000 + b"}",
        b'{"a":1} trailing',
    ],
)
def test_malformed_json_is_422(deployment: Deployment, raw: bytes) -> None:
    key = new_key()
    assert_problem(_raw(deployment, key, raw), 422, "validation_error")
    _no_trace(deployment, key)


PAN_BODIES: dict[str, Any] = {
    "metadata value": body(metadata={"card": VISA_PAN}),
    "spaced": body(metadata={"note": "card 4111 1111 1111 1111 ok"}),
    "dashed": body(metadata={"note": "5555-5555-5555-4444"}),
    "numeric": body(metadata={"n": int(VISA_PAN)}),
    "nested list": body(metadata={"a": [{"b": ["x", "378282246310005"]}]}),
    "object key": body(metadata={VISA_PAN: "x"}),
    "in the token": body(card={"token": f"tok_{VISA_PAN}", "last4": "1111", "brand": "visa"}),
    "terminal id": body(terminal_id=VISA_PAN),
    "unknown field": body(pan=VISA_PAN),
    "as amount": body(amount=int(VISA_PAN)),
}


@pytest.mark.parametrize("case", list(PAN_BODIES))
def test_card_number_anywhere_is_refused_and_never_stored(
    deployment: Deployment, case: str
) -> None:
    key = new_key()
    response = _raw(deployment, key, json.dumps(PAN_BODIES[case]).encode())
    problem = assert_problem(response, 422, "pan_not_allowed")
    assert VISA_PAN not in response.text and "errors" not in problem
    _no_trace(deployment, key)


def test_integral_float_amount_is_the_same_integer(deployment: Deployment) -> None:
    key = new_key()
    first = deployment.a.create(key, body(amount=1250.0))
    assert first.status_code == 201 and first.json()["amount"] == 1250
    replay = deployment.a.create(key, body(amount=1250))  # same canonical body
    assert replay.headers["idempotent-replayed"] == "true"


def test_luhn_failing_digit_runs_are_not_pans(deployment: Deployment) -> None:
    key = new_key()
    response = deployment.a.create(key, body(metadata={"order": "4111111111111112"}))
    assert response.status_code == 201


def test_unknown_route_and_method_are_problems(deployment: Deployment) -> None:
    with deployment.a.client() as client:
        assert_problem(client.get("/v1/nothing-here"), 404, "not_found")
        assert_problem(client.delete("/v1/transactions"), 405, "method_not_allowed")


@pytest.mark.parametrize("scheme", ["bearer", "BEARER", "BeArEr"])
def test_the_auth_scheme_is_case_insensitive(deployment: Deployment, scheme: str) -> None:
    """RFC 9110 §11.1: "bearer" is the same scheme as "Bearer"."""
    key = new_key()
    headers = {"Authorization": f"{scheme} {deployment.a.api_key}"}
    with deployment.a.client() as client:
        response = client.get(f"/v1/transactions/{key}", headers=headers)
    assert_problem(response, 404, "not_found")


@pytest.mark.parametrize("field", ["captured_at", "expires_at"])
@pytest.mark.parametrize("value", [0, 1_795_000_000, 4_102_444_800.0])
def test_a_numeric_timestamp_is_422_not_read_as_unix_seconds(
    deployment: Deployment, field: str, value: float
) -> None:
    key = new_key()
    response = deployment.a.create(key, body(**{field: value}))
    assert_problem(response, 422, "validation_error")
    _no_trace(deployment, key)


def _spliced(**fields: str) -> bytes:
    """The spec's body as JSON text, with ``fields`` spliced in verbatim before its end."""
    text = json.dumps(body())[:-1]
    return (text + "".join(f', "{name}": {raw}' for name, raw in fields.items()) + "}").encode()


@pytest.mark.parametrize(
    ("raw", "loc"),
    [
        # the last "amount" wins in json.loads: 999,999 charged for a body that says 1
        (b'{"amount": 1, ' + _spliced(amount="999999")[1:], ["amount"]),
        (_spliced(metadata='{"order": "A", "order": "B"}'), ["metadata", "order"]),
        (_spliced(card='{"token": "tok_visa_4242", "last4": "4242", "brand": "visa"}'), ["card"]),
    ],
    ids=["amount", "metadata", "card"],
)
def test_duplicate_names_are_422_naming_the_field(
    deployment: Deployment, raw: bytes, loc: list[str]
) -> None:
    key = new_key()
    problem = assert_problem(_raw(deployment, key, raw), 422, "validation_error")
    assert [err["loc"] for err in problem["errors"]] == [loc]
    assert deployment.a.lookup(key).status_code == 404
    _no_trace(deployment, key)


@pytest.mark.parametrize("number", ["1e400", "-1e400", "NaN", "Infinity", "-Infinity"])
def test_non_finite_numbers_are_422_naming_the_field(deployment: Deployment, number: str) -> None:
    key = new_key()
    raw = json.dumps(body(metadata={"x": "PLACEHOLDER"})).replace('"PLACEHOLDER"', number)
    problem = assert_problem(_raw(deployment, key, raw.encode()), 422, "validation_error")
    assert [err["loc"] for err in problem["errors"]] == [["metadata", "x"]]
    _no_trace(deployment, key)


def test_an_infinite_number_never_replays_a_different_body(deployment: Deployment) -> None:
    """``1e400`` fingerprinted like ``null``: another body replayed instead of 422
    ``idempotency_key_reused``. Now it is refused before the fingerprint, nothing stored."""
    key = new_key()
    first = deployment.a.create(key, body(metadata={"x": None}))
    assert first.status_code == 201, first.text
    raw = json.dumps(body(metadata={"x": "PLACEHOLDER"})).replace('"PLACEHOLDER"', "1e400")
    assert_problem(_raw(deployment, key, raw.encode()), 422, "validation_error")
    assert deployment.a.lookup(key).json()["status"] == "approved"
