"""Slowloris (docs/security.md, "Slow clients"): slow headers and slow bodies are timed out
(408 problem+json, or a close when the client sent nothing), and while many are held open
the server keeps answering normal requests. Timeouts are 1.5 s here (SHORT_TIMEOUTS); the
tests assert that the timeout happened, not when."""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass

import httpx

from tests.api.fuzz.conftest import Target
from tests.api.fuzz.contract import check_problem, check_response
from tests.support.client import body, new_key

SLOW = 40  # connections of each kind held open at once
GIVE_UP = 30.0  # seconds: only so that a server that never times out fails instead of hanging


@dataclass
class Answer:
    status: int | None  # None: closed without a response
    headers: dict[str, str]
    body: bytes


def _parse(raw: bytes) -> Answer:
    if not raw:
        return Answer(None, {}, b"")
    head, _, rest = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", len(rest)))
    return Answer(status, headers, rest[:length])


async def _trickle(
    target: Target, head: bytes, drip: bytes, *, every: float = 0.4
) -> tuple[Answer, int]:
    """Send ``head`` at once, then ``drip`` a byte every ``every`` seconds until the server
    answers or closes; returns its answer and how many drip bytes it took."""
    reader, writer = await asyncio.open_connection(*target.host_port)
    sent = 0
    try:
        writer.write(head)
        await writer.drain()

        async def drip_forever() -> None:
            nonlocal sent
            for byte in drip:
                await asyncio.sleep(every)
                writer.write(bytes([byte]))
                await writer.drain()
                sent += 1
            await asyncio.sleep(3600)

        dripping = asyncio.create_task(drip_forever())
        try:
            async with asyncio.timeout(GIVE_UP):
                raw = await reader.read()  # until the server closes the connection
        finally:
            dripping.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError, OSError):
                await dripping
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await writer.wait_closed()
    return _parse(raw), sent


async def _idle(target: Target) -> bytes:
    reader, writer = await asyncio.open_connection(*target.host_port)
    try:
        async with asyncio.timeout(GIVE_UP):
            return await reader.read()
    finally:
        writer.close()


def _create_head(target: Target, key: str, length: int) -> bytes:
    return (
        "POST /v1/transactions HTTP/1.1\r\nHost: fuzz\r\n"
        f"Authorization: Bearer {target.api.api_key}\r\nIdempotency-Key: {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    ).encode()


async def _normal_traffic(target: Target, until: asyncio.Event) -> list[httpx.Response]:
    """Ordinary creates and lookups, one after another, while the attack lasts."""
    answers: list[httpx.Response] = []
    async with httpx.AsyncClient(base_url=target.server.url, timeout=10.0) as client:
        while not until.is_set() or len(answers) < 4:
            key = new_key()
            created = await client.post(
                "/v1/transactions", json=body(), headers=target.api.headers(key)
            )
            looked = await client.get(f"/v1/transactions/{key}", headers=target.api.headers(None))
            answers += [created, looked]
            await asyncio.sleep(0.05)
    return answers


def test_slow_headers_and_bodies_time_out_while_normal_requests_are_served(
    pg_target: Target,
) -> None:
    target = pg_target
    payload = json.dumps(body()).encode()
    slow_keys = [new_key() for _ in range(SLOW)]

    async def attack() -> tuple[list[Answer], list[Answer], list[bytes], list[httpx.Response]]:
        done = asyncio.Event()
        traffic = asyncio.create_task(_normal_traffic(target, done))
        header_head = b"POST /v1/transactions HTTP/1.1\r\nHost: fuzz\r\n"
        slow_headers = [
            _trickle(target, header_head, b"X-Slow: " + b"a" * 200) for _ in range(SLOW)
        ]
        slow_bodies = [
            _trickle(target, _create_head(target, key, len(payload)), payload) for key in slow_keys
        ]
        idle = [_idle(target) for _ in range(SLOW // 4)]
        headers_done = asyncio.gather(*slow_headers)
        bodies_done = asyncio.gather(*slow_bodies)
        idle_done = asyncio.gather(*idle)
        header_answers = [answer for answer, _ in await headers_done]
        body_results = await bodies_done
        idle_answers = await idle_done
        done.set()
        # Every body was still incomplete when the server gave up on it.
        assert all(sent < len(payload) for _, sent in body_results)
        return header_answers, [a for a, _ in body_results], idle_answers, await traffic

    header_answers, body_answers, idle_answers, normal = asyncio.run(attack())

    for answer in header_answers + body_answers:
        assert answer.status == 408, answer
        assert answer.headers["connection"] == "close"
        assert answer.headers.get("x-request-id")
        problem = check_problem(408, answer.headers["content-type"], answer.body)
        assert problem["code"] == "request_timeout"
    for answer in body_answers:
        assert answer.headers["idempotency-status"] == "not_found"
    assert idle_answers == [b""] * len(idle_answers)  # closed, nothing to answer

    # Normal requests were answered throughout, and correctly.
    assert len(normal) >= 4
    for response in normal:
        check_response(response, target.schemas)
        assert response.status_code in (200, 201), response.text

    # Nothing was processed for the timed-out bodies: the key is free, and the same
    # request with the same key now goes through, once.
    for key in slow_keys[:3]:
        assert target.api.lookup(key).status_code == 404
        assert target.api.create(key).status_code == 201


def test_a_body_left_unread_after_the_answer_must_still_arrive_in_time(
    pg_target: Target,
) -> None:
    """Declared over 16 KiB: the server answers 413 at once, and the client then has the body
    timeout to finish sending what it declared, or the connection is closed."""
    head = _create_head(pg_target, new_key(), 100_000)
    answer, _ = asyncio.run(_trickle(pg_target, head, b"x" * 1000, every=0.2))
    assert answer.status == 413
    check_problem(413, answer.headers["content-type"], answer.body)
    # _trickle returned, so the server closed the connection while the body still dripped.


def test_oversized_headers_get_431_problem(pg_target: Target) -> None:
    async def send() -> bytes:
        reader, writer = await asyncio.open_connection(*pg_target.host_port)
        try:
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (2 << 20))
            with contextlib.suppress(ConnectionError):
                await writer.drain()
            async with asyncio.timeout(GIVE_UP):
                return await reader.read()
        finally:
            writer.close()

    answer = _parse(asyncio.run(send()))
    assert answer.status == 431, answer
    problem = check_problem(431, answer.headers["content-type"], answer.body)
    assert problem["code"] == "request_headers_too_large"
    assert httpx.get(f"{pg_target.server.url}/healthz").status_code == 200


def test_headers_just_under_the_cap_are_served(pg_target: Target) -> None:
    response = httpx.get(
        f"{pg_target.server.url}/v1/idempotency-policy", headers={"X-Pad": "p" * 60_000}
    )
    assert response.status_code == 200
