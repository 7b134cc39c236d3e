"""Bytes no HTTP client would send (contract §2: no input may produce a 5xx or a half-written
transaction): random bytes, malformed request lines and headers, chunked-encoding garbage,
truncated bodies. Whatever the server answers is < 500 and problem+json for 4xx; it never
crashes, never logs an unhandled error, keeps serving, and the database stays whole.

The corpus is generated from a fixed seed (reproducible in CI) and fired concurrently."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import uuid
from collections.abc import Callable

import httpx
import pytest

from tests.api.fuzz.conftest import Target
from tests.api.fuzz.contract import assert_whole, check_problem
from tests.support.client import body, new_key
from tests.support.eventually import eventually

SEED = 20261121
PER_KIND = 24
CONCURRENCY = 32
READ_FOR = 8.0  # seconds to wait for an answer; the header/body timeouts are 1.5 s


def _valid_payload(rng: random.Random) -> bytes:
    return json.dumps(body(amount=rng.randint(1, 10**6))).encode()


class Corpus:
    """Raw requests by kind; ``keys`` are the idempotency keys of requests that must not
    have been processed (truncated or malformed before their body was complete)."""

    def __init__(self, target: Target, seed: int) -> None:
        self.rng = random.Random(seed)
        self.auth = f"Authorization: Bearer {target.api.api_key}\r\n".encode()
        self.unprocessed_keys: list[str] = []
        self.items: list[tuple[str, bytes]] = []
        kinds: dict[str, Callable[[], bytes]] = {
            "random_bytes": self.random_bytes,
            "request_line": self.request_line,
            "header_garbage": self.header_garbage,
            "content_length": self.content_length,
            "chunked": self.chunked,
            "truncated_body": self.truncated_body,
            "valid_then_garbage": self.valid_then_garbage,
        }
        for kind, make in kinds.items():
            for _ in range(PER_KIND):
                self.items.append((kind, make()))

    def _key(self, *, unprocessed: bool) -> str:
        key = new_key()
        if unprocessed:
            self.unprocessed_keys.append(key)
        return key

    def _bytes(self, low: int, high: int) -> bytes:
        return self.rng.randbytes(self.rng.randint(low, high))

    def random_bytes(self) -> bytes:
        choice = self.rng.randrange(3)
        if choice == 0:
            return self._bytes(1, 4096)
        if choice == 1:  # printable junk with line breaks
            alphabet = b"GETPOSThttp/1.:\r\n \t{}\"'%\x00\xff"
            return bytes(self.rng.choice(alphabet) for _ in range(self.rng.randint(1, 512)))
        return b"POST /v1/transactions HTTP/1.1\r\n" + self._bytes(1, 2048)

    def request_line(self) -> bytes:
        lines = [
            b"GET /healthz HTTP/9.9",
            b"GET /healthz",
            b"GET  /healthz  HTTP/1.1",
            b"get /healthz HTTP/1.1",
            b"BREW /healthz HTTP/1.1",
            b"POST * HTTP/1.1",
            b"CONNECT 127.0.0.1:1 HTTP/1.1",
            b"GET http://evil.example/v1/idempotency-policy HTTP/1.1",
            b"GET /v1/transactions/\xff\xfe HTTP/1.1",
            b"GET /v1/transactions/%ff%fe%00 HTTP/1.1",
            b"GET /v1/transactions/" + b"%" * 50 + b" HTTP/1.1",
            b"GET /\x00 HTTP/1.1",
            b"GET /" + b"a" * 70_000 + b" HTTP/1.1",
            b"GET /v1/transactions/" + str(uuid.uuid4()).encode() + b"?x=\xff HTTP/1.1",
            b"\r\n\r\nGET /healthz HTTP/1.1",
            b"GET /healthz HTTP/1.1 extra",
            b"GET /../../etc/passwd HTTP/1.1",
            b"OPTIONS /v1/transactions HTTP/1.1",
            b"TRACE /v1/transactions HTTP/1.1",
            b"HEAD /v1/transactions HTTP/1.0",
            b"DELETE /v1/transactions/" + str(uuid.uuid4()).encode() + b" HTTP/1.1",
        ]
        line = self.rng.choice(lines)
        # Connection: close so that a line the server accepts does not idle in keep-alive.
        return line + b"\r\nHost: fuzz\r\nConnection: close\r\n" + self.auth + b"\r\n"

    def header_garbage(self) -> bytes:
        key = self._key(unprocessed=True)
        bad = self.rng.choice(
            [
                b"NoColonHere\r\n",
                b"Bad Name: x\r\n",
                b"X-Fold: a\r\n  folded\r\n",
                b": empty-name\r\n",
                b"X-Nul: a\x00b\r\n",
                b"X-Bare-CR: a\rb\r\n",
                b"Idempotency-Key: \xff\xfe" + key.encode() + b"\r\n",
                b"Content-Length: 5\r\nContent-Length: 7\r\n",
                b"Content-Length: -1\r\n",
                b"Content-Length: 1e3\r\n",
                b"Content-Length: 99999999999999999999999\r\n",
                b"Transfer-Encoding: gzip\r\n",
                b"Transfer-Encoding: chunked\r\nContent-Length: 3\r\n",
                b"Expect: 100-continue\r\n",
                b"Host: a\r\nHost: b\r\n",
                b"Authorization: Bearer \xff\xfe\r\n",
            ]
        )
        return (
            b"POST /v1/transactions HTTP/1.1\r\nHost: fuzz\r\n"
            + self.auth
            + b"Idempotency-Key: "
            + key.encode()
            + b"\r\n"
            + bad
            + b"\r\n{"
        )

    def content_length(self) -> bytes:
        """A declared length that does not match what follows (then the client goes away)."""
        key = self._key(unprocessed=True)
        payload = _valid_payload(self.rng)
        declared = len(payload) + self.rng.choice([1, 10, 1000, 16 * 1024 - len(payload)])
        return self._create(key, payload, declared)

    def truncated_body(self) -> bytes:
        key = self._key(unprocessed=True)
        payload = _valid_payload(self.rng)
        cut = self.rng.randint(0, len(payload) - 1)
        return self._create(key, payload[:cut], len(payload))

    def chunked(self) -> bytes:
        key = self._key(unprocessed=True)
        payload = _valid_payload(self.rng)
        bad = self.rng.choice(
            [
                b"zz\r\n" + payload + b"\r\n0\r\n\r\n",  # size not hex
                b"%x\r\n" % (len(payload) + 5) + payload + b"\r\n0\r\n\r\n",  # short chunk
                b"%x\r\n" % len(payload) + payload + b"0\r\n\r\n",  # missing CRLF
                b"-5\r\n" + payload + b"\r\n0\r\n\r\n",
                b"ffffffffffffffffffff\r\n" + payload,
                b"%x;ext=\x00\r\n" % len(payload) + payload + b"\r\n0\r\n\r\n",
                b"%x\r\n" % len(payload) + payload + b"\r\n",  # no last chunk
                b"5\r\n" + payload[:5],  # then silence
            ]
        )
        return (
            b"POST /v1/transactions HTTP/1.1\r\nHost: fuzz\r\n"
            + self.auth
            + b"Idempotency-Key: "
            + key.encode()
            + b"\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
            + bad
        )

    def valid_then_garbage(self) -> bytes:
        """A complete, valid create followed on the same connection by junk: the create is
        processed (and must be whole), the junk is refused."""
        payload = _valid_payload(self.rng)
        return self._create(new_key(), payload, len(payload)) + self._bytes(1, 600)

    def _create(self, key: str, payload: bytes, declared: int) -> bytes:
        return (
            b"POST /v1/transactions HTTP/1.1\r\nHost: fuzz\r\n"
            + self.auth
            + b"Idempotency-Key: "
            + key.encode()
            + b"\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % declared
            + payload
        )


def _statuses(raw: bytes) -> list[tuple[int, str, bytes]]:
    """(status, content-type, body) of each response in ``raw`` (pipelined or not)."""
    answers = []
    while raw.startswith(b"HTTP/1.1 "):
        head, sep, rest = raw.partition(b"\r\n\r\n")
        if not sep:
            break
        lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if "content-length" in headers:
            length = int(headers["content-length"])
            content, raw = rest[:length], rest[length:]
        else:  # chunked: good enough for the small answers here
            content, raw = rest, b""
        answers.append((int(lines[0].split(" ", 2)[1]), headers.get("content-type", ""), content))
    return answers


async def _fire(target: Target, payload: bytes, *, half_close: bool) -> bytes:
    reader, writer = await asyncio.open_connection(*target.host_port)
    try:
        with contextlib.suppress(ConnectionError):
            writer.write(payload)
            await writer.drain()
            if half_close and writer.can_write_eof():
                writer.write_eof()
        chunks = []
        with contextlib.suppress(TimeoutError, ConnectionError):
            async with asyncio.timeout(READ_FOR):
                while chunk := await reader.read(65536):
                    chunks.append(chunk)
        return b"".join(chunks)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await writer.wait_closed()


async def _fire_all(target: Target, corpus: Corpus) -> list[tuple[str, bytes, bytes]]:
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(index: int, kind: str, payload: bytes) -> tuple[str, bytes, bytes]:
        async with gate:
            # Half of them also close their sending side: truncation "then close".
            return kind, payload, await _fire(target, payload, half_close=index % 2 == 0)

    return await asyncio.gather(*(one(i, k, p) for i, (k, p) in enumerate(corpus.items)))


@pytest.mark.parametrize("target_name", ["pg_target", "sqlite_target"])
def test_raw_bytes_never_break_the_server(target_name: str, request: pytest.FixtureRequest) -> None:
    target: Target = request.getfixturevalue(target_name)
    corpus = Corpus(target, SEED)
    results = asyncio.run(_fire_all(target, corpus))

    answered = 0
    for kind, payload, raw in results:
        for status, content_type, content in _statuses(raw):
            answered += 1
            assert status < 500, (kind, payload[:300], raw[:500])
            if status >= 400:
                check_problem(status, content_type, content)
    assert answered >= len(results) // 2  # most got an answer; the rest were closed

    # Still alive and serving, correctly.
    assert target.server.proc is not None and target.server.proc.poll() is None
    assert httpx.get(f"{target.server.url}/healthz", timeout=5).status_code == 200
    key = new_key()
    assert target.api.create(key).status_code == 201
    assert target.api.lookup(key).status_code == 200

    # Nothing truncated or malformed was processed; nothing is half-written.
    with target.api.client() as client:
        for key in corpus.unprocessed_keys:
            lookup = client.get(f"/v1/transactions/{key}", headers=target.api.headers(None))
            assert lookup.status_code == 404, (key, lookup.text)
    report = assert_whole(target.backend, [target.merchant])
    assert report.transactions >= PER_KIND  # the valid_then_garbage creates went through
    log = target.log_text()
    for marker in ("Traceback", "internal_error", "unhandled_error", "Exception in ASGI"):
        assert marker not in log, log[log.find(marker) - 500 : log.find(marker) + 2000]


def test_a_truncated_body_then_close_leaves_no_trace(pg_target: Target) -> None:
    """Regression: a body cut short by a client that hangs up used to reach the route, whose
    body read raised ClientDisconnect — logged as internal_error with a traceback, and
    recorded as a create event with outcome `error` and status 500 that no client ever saw."""
    key = new_key()
    payload = json.dumps(body()).encode()
    head = (
        "POST /v1/transactions HTTP/1.1\r\nHost: fuzz\r\n"
        f"Authorization: Bearer {pg_target.api.api_key}\r\nIdempotency-Key: {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    ).encode()

    async def send_and_hang_up() -> None:
        _, writer = await asyncio.open_connection(*pg_target.host_port)
        writer.write(head + payload[: len(payload) // 2])
        await writer.drain()
        await asyncio.sleep(0.2)
        writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await writer.wait_closed()

    asyncio.run(send_and_hang_up())
    assert pg_target.api.lookup(key).status_code == 404
    # The lookup's own event is recorded after anything the cut create could have left, and
    # the writer flushes in order: once it is in the table, a create event would be too.
    events = eventually(
        lambda: pg_target.backend.sql(
            "SELECT endpoint, outcome, http_status FROM request_event WHERE idempotency_key = :k",
            k=key,
        ),
        until=lambda rows: ("lookup", "not_found", 404) in [tuple(row) for row in rows],
        what="the lookup's request event",
    )
    creates = [tuple(row) for row in events if row[0] == "create"]
    assert creates == []  # the create never arrived whole: nothing to record
    assert "internal_error" not in pg_target.log_text()
