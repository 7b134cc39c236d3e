"""Idempotency-Key values (and other request bytes) cannot forge log records: the server
answers 400/404 problem+json and its log stays one JSON record per line."""

from __future__ import annotations

import json
import socket
import uuid
from dataclasses import dataclass

import pytest

from tests.api.security.conftest import Audited, log_records

FORGED = '{"event": "FORGED", "level": "info", "timestamp": "2026-01-01T00:00:00Z"}'
UUID = "6f1c4a52-8d1e-4c1e-9a63-2b4f0c6e9d10"
SPLIT_KEY = str(uuid.uuid4())  # the one valid key sent in this module


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str]
    body: bytes

    def problem(self) -> dict[str, object]:
        assert self.headers.get("content-type", "").startswith("application/problem+json"), self
        problem = json.loads(self.body)
        assert isinstance(problem, dict) and problem["status"] == self.status
        return problem


def raw_request(port: int, head: bytes, body: bytes = b"") -> RawResponse:
    """Send bytes no HTTP client would send; read the answer up to the connection close."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head + b"\r\n" + body)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    header_block, _, payload = data.partition(b"\r\n\r\n")
    lines = header_block.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return RawResponse(int(lines[0].split()[1]), headers, payload)


def _head(audited: Audited, method: str, target: bytes, *extra: bytes) -> bytes:
    lines = [
        method.encode() + b" " + target + b" HTTP/1.1",
        b"Host: 127.0.0.1",
        b"Authorization: Bearer " + audited.api.api_key.encode(),
        b"Connection: close",
        *extra,
    ]
    return b"".join(line + b"\r\n" for line in lines)


KEY_VALUES = {
    "crlf + forged record": UUID.encode() + b"\r\n" + FORGED.encode(),
    "bare cr": UUID.encode() + b"\r" + FORGED.encode(),
    "bare lf": UUID.encode() + b"\n" + FORGED.encode(),
    "nul": UUID[:8].encode() + b"\x00FORGED",
    "escape (ANSI)": b"\x1b[2J\x1b[1;1HFORGED",
    "vertical tab, form feed": b"FORGED\x0b\x0c" + UUID.encode(),
    "del": UUID.encode() + b"\x7fFORGED",
    "tab": UUID.encode() + b"\tFORGED",
    "unicode line separator (utf-8)": UUID.encode() + "\u2028FORGED\u0085".encode(),
    "latin-1 high bytes": b"\xff\xfeFORGED",
}


BODY = json.dumps(
    {
        "terminal_id": "T-1",
        "amount": 100,
        "currency": "BRL",
        "card": {"token": "tok_visa_4242", "last4": "4242", "brand": "visa"},
    }
).encode()


def _create(audited: Audited, key_value: bytes) -> RawResponse:
    head = _head(
        audited,
        "POST",
        b"/v1/transactions",
        b"Content-Type: application/json",
        b"Content-Length: " + str(len(BODY)).encode(),
        b"Idempotency-Key: " + key_value,
    )
    return raw_request(audited.server.port, head, BODY)


@pytest.mark.parametrize("value", KEY_VALUES.values(), ids=KEY_VALUES.keys())
def test_idempotency_key_header_with_control_characters(audited: Audited, value: bytes) -> None:
    response = _create(audited, value)
    assert response.status == 400, response
    # the parser refused the bytes (malformed_request) or the app refused the key
    assert response.problem()["code"] in ("malformed_request", "idempotency_key_invalid")


def test_crlf_after_a_valid_key_only_starts_another_header(audited: Audited) -> None:
    """On the wire CRLF ends a header: the key is the clean UUID before it, the rest is a
    header of its own (ignored). Nothing reaches the log but the canonical key."""
    response = _create(audited, SPLIT_KEY.encode() + b"\r\nX-Forged: FORGED")
    assert response.status == 201, response
    assert response.headers["idempotency-status"] == "created"


PATH_IDS = [
    "%0d%0a" + FORGED.replace(" ", "%20").replace('"', "%22"),
    UUID + "%0d%0aX-Forged:%20FORGED",
    UUID + "%0aFORGED",
    UUID + "%0dFORGED",
    "%00FORGED",
    "%1b%5b2JFORGED",
    "%e2%80%a8FORGED",
    "%c2%85FORGED",
    "%ff%feFORGED",
    UUID + "%09FORGED",
]


@pytest.mark.parametrize("endpoint", ["lookup", "abort", "reversal"])
def test_percent_encoded_control_characters_in_the_path_id(audited: Audited, endpoint: str) -> None:
    method, suffix = {"lookup": ("GET", ""), "abort": ("POST", "/abort")}.get(
        endpoint, ("POST", "/reversal")
    )
    for path_id in PATH_IDS:
        target = f"/v1/transactions/{path_id}{suffix}".encode()
        extra = (b"Content-Length: 0",) if method == "POST" else ()
        response = raw_request(audited.server.port, _head(audited, method, target, *extra))
        assert response.status in (400, 404), (path_id, response)
        code = response.problem()["code"]
        assert code in ("idempotency_key_invalid", "not_found"), (path_id, code)
        assert b"FORGED" not in response.body


def test_other_headers_with_control_characters(audited: Audited) -> None:
    for name in (b"X-Request-Id", b"POS-Network", b"Idempotency-Attempt", b"Authorization"):
        for value in (b"a\x1b[2JFORGED", b"a\x7fFORGED", b"a\tFORGED\x0b"):
            head = _head(audited, "GET", f"/v1/transactions/{UUID}".encode(), name + b": " + value)
            response = raw_request(audited.server.port, head)
            assert response.status in (400, 401, 404), (name, value, response)
            response.problem()
            assert b"FORGED" not in response.body
            assert "FORGED" not in response.headers.get("x-request-id", "")


def test_the_log_is_one_well_formed_record_per_line(audited: Audited) -> None:
    """Runs last in this module: everything above has been logged by now. The checks on the
    records come first, on every line that parses; the strict read (every line one JSON
    record) last."""
    text = audited.log.read_text()
    parsed = [_json_or_none(line) for line in text.splitlines()]
    records = [record for record in parsed if isinstance(record, dict)]
    assert records, "nothing was logged"
    assert text.endswith("\n")
    assert not [r for r in records if r.get("event") == "FORGED"]
    assert "FORGED" not in text  # nothing logs raw request bytes at all
    requests = [r for r in records if r.get("event") == "request"]
    assert requests and {r.get("key") for r in requests} == {None, SPLIT_KEY}
    assert all(set(r["request_id"]) <= set("0123456789abcdef") for r in requests)
    strict = log_records(audited.log)  # every line parses as one JSON object
    assert text.count("\n") == len(strict)


def _json_or_none(line: str) -> object:
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        return None
