"""Oversize bodies are refused before parsing (413), deep nesting within 16 KiB is a 422
(never a 500 or a RecursionError), and metadata's depth and size limits hold. Both backends."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from api.transactions.http import MAX_BODY_BYTES
from api.transactions.schemas import METADATA_MAX_BYTES, METADATA_MAX_DEPTH
from tests.api.conftest import Deployment
from tests.api.security.conftest import KeptApi
from tests.support.client import assert_problem, body, new_key


def _post(api: KeptApi, content: Any, key: str | None = None, **headers: str) -> httpx.Response:
    with api.client() as client:
        return client.post(
            "/v1/transactions",
            content=content,
            headers={
                **api.headers(key or new_key()),
                "Content-Type": "application/json",
                **headers,
            },
        )


def _chunks(data: bytes, size: int = 1024) -> Iterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


def test_over_16_kib_is_413_before_parsing(deployment: Deployment, api: KeptApi) -> None:
    key = new_key()
    valid_but_big = json.dumps(body(metadata={"x": "a" * 17_000})).encode()
    not_json = b"{" * (MAX_BODY_BYTES + 1)  # a parser would say 422: it never runs
    for content in (valid_but_big, not_json):
        assert_problem(_post(api, content, key), 413, "payload_too_large")
        # chunked, no Content-Length: counted while read, refused at the 16 KiB mark
        response = _post(api, _chunks(content), key)
        assert "content-length" not in response.request.headers
        assert response.request.headers["transfer-encoding"] == "chunked"
        assert_problem(response, 413, "payload_too_large")
    exactly = json.dumps(body(metadata={"x": "a" * 10})).encode()
    exactly += b" " * (MAX_BODY_BYTES - len(exactly))  # 16 KiB on the dot is allowed
    assert len(exactly) == MAX_BODY_BYTES
    assert _post(api, exactly, key).status_code == 201
    assert deployment.count("transaction", id=key) == 1


def test_a_declared_huge_body_is_refused_without_reading_it(api: KeptApi) -> None:
    """Content-Length of 1 GB, 10 bytes sent: the 413 comes at once, not after a timeout."""
    port = int(api.base_url.rsplit(":", 1)[1])
    head = (
        "POST /v1/transactions HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {api.api_key}\r\nIdempotency-Key: {new_key()}\r\n"
        "Content-Type: application/json\r\nContent-Length: 1000000000\r\n\r\n"
    ).encode()
    # The socket gives up after 5 s, before the server's 10-s body timeout: a server that
    # waited for the body would time this read out (or answer 408), never 413.
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(head + b'{"terminal')
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.endswith(b"}"):  # whole problem body
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    assert b"payload_too_large" in answer


def _arrays(depth: int) -> str:
    return "[" * depth + "]" * depth


def _objects(depth: int) -> str:
    return '{"":' * depth + "1" + "}" * depth


HOLE = "@@hole@@"


def _in_body(fragment: str, **fields: Any) -> str:
    """A valid body with ``fragment`` (raw JSON text) where HOLE is: no parser involved."""
    return json.dumps(body(**fields)).replace(json.dumps(HOLE), fragment)


DEEP = {
    "5000 arrays as the body": _arrays(5000),
    "3000 objects as the body": _objects(3000),
    "5000 arrays in metadata": '{"terminal_id":"T-1","metadata":{"a":' + _arrays(5000) + "}}",
    "3000 objects in metadata": '{"terminal_id":"T-1","metadata":' + _objects(3000) + "}",
    "5000 arrays in card": '{"terminal_id":"T-1","card":' + _arrays(5000) + "}",
    "5000 arrays in an unknown field": '{"x":' + _arrays(5000) + "}",
    "990 arrays in metadata": _in_body(_arrays(990), metadata={"a": HOLE}),
    "900 arrays in metadata": _in_body(_arrays(900), metadata={"a": HOLE}),
    "900 objects in metadata": _in_body(_objects(900), metadata={"a": HOLE}),
    "200 arrays in metadata": _in_body(_arrays(200), metadata={"a": HOLE}),
    "900 arrays in card.token": _in_body(_arrays(900), card={"token": HOLE}),
    "900 arrays in amount": _in_body(_arrays(900), amount=HOLE),
}


@pytest.mark.parametrize("content", DEEP.values(), ids=DEEP.keys())
def test_deep_nesting_within_16_kib_is_422(
    deployment: Deployment, api: KeptApi, content: str
) -> None:
    assert len(content.encode()) <= MAX_BODY_BYTES
    key = new_key()
    assert_problem(_post(api, content.encode(), key), 422, "validation_error")
    assert deployment.count("idempotency_key", key=key) == 0


def _nested(depth: int) -> dict[str, Any]:
    """A metadata object ``depth`` levels deep (the metadata object itself is level 1)."""
    value: dict[str, Any] = {"leaf": 1}
    for _ in range(depth - 1):
        value = {"n": value}
    return value


def test_metadata_depth_and_size_limits(api: KeptApi) -> None:
    assert api.create(new_key(), body(metadata=_nested(METADATA_MAX_DEPTH))).status_code == 201
    problem = assert_problem(
        api.create(new_key(), body(metadata=_nested(METADATA_MAX_DEPTH + 1))),
        422,
        "validation_error",
    )
    assert problem["errors"][0]["loc"] == ["metadata"]
    filler = "x" * (METADATA_MAX_BYTES - len('{"n":""}'))
    assert api.create(new_key(), body(metadata={"n": filler})).status_code == 201
    too_big = assert_problem(
        api.create(new_key(), body(metadata={"n": filler + "x"})), 422, "validation_error"
    )
    assert too_big["errors"][0]["loc"] == ["metadata"]
    wide = {f"k{i}": i for i in range(300)}  # many keys, under 4 KiB: fine
    assert api.create(new_key(), body(metadata=wide)).status_code == 201
    with api.client() as client:
        assert client.get("/healthz").status_code == 200  # still serving after all this
