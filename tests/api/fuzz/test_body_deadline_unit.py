"""``BodyDeadlineMiddleware`` on its own (pure ASGI, no server): the body is read whole within
the deadline and handed over intact, or the client gets 408 problem+json and the app is
never called; a client that hangs up mid-body reaches nothing."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.types import Message, Receive, Scope, Send

from api.http_limits import BodyDeadlineMiddleware

LIMIT = 1024


class RecordingApp:
    def __init__(self) -> None:
        self.calls = 0
        self.received: list[Message] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.calls += 1
        while True:
            message = await receive()
            self.received.append(message)
            if message["type"] == "http.disconnect" or not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def _scope(path: str = "/v1/transactions", content_length: int | None = None) -> Scope:
    headers = [(b"host", b"x")]
    if content_length is not None:
        headers.append((b"content-length", str(content_length).encode()))
    return {"type": "http", "method": "POST", "path": path, "headers": headers}


def _receiver(
    chunks: list[bytes], *, delay: float = 0.0, end: str = "complete"
) -> tuple[Callable[[], Awaitable[Message]], list[int]]:
    """Deliver ``chunks``, then ``end``: the last chunk closes the body ("complete"), the
    client hangs up ("disconnect") or never sends the rest ("hang")."""
    served = [0]

    async def receive() -> Message:
        index = served[0]
        served[0] += 1
        if delay:
            await asyncio.sleep(delay)
        if index < len(chunks):
            last = index == len(chunks) - 1 and end == "complete"
            return {"type": "http.request", "body": chunks[index], "more_body": not last}
        if end == "disconnect":
            return {"type": "http.disconnect"}
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    return receive, served


async def _run(
    scope: Scope, receive: Callable[[], Awaitable[Message]], *, deadline: float = 0.5
) -> tuple[RecordingApp, list[Message]]:
    app = RecordingApp()
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    await BodyDeadlineMiddleware(app, timeout=deadline, limit=LIMIT)(scope, receive, send)
    return app, sent


def _headers(message: Message) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in message["headers"]}


async def test_a_body_in_chunks_reaches_the_app_whole_and_once() -> None:
    receive, _ = _receiver([b'{"a":', b" 1", b"}"], delay=0.01)
    app, sent = await _run(_scope(), receive)
    assert app.calls == 1
    assert app.received == [{"type": "http.request", "body": b'{"a": 1}', "more_body": False}]
    assert sent[0]["status"] == 200


async def test_a_slow_body_gets_408_problem_and_the_app_never_runs() -> None:
    receive, _ = _receiver([b'{"a":'], end="hang")
    app, sent = await _run(_scope(), receive, deadline=0.2)
    assert app.calls == 0
    start, body = sent
    assert start["status"] == 408
    headers = _headers(start)
    assert headers["content-type"] == "application/problem+json"
    assert headers["connection"] == "close"
    assert headers["idempotency-status"] == "not_found"
    assert int(headers["content-length"]) == len(body["body"])
    problem = json.loads(body["body"])
    assert problem["code"] == "request_timeout" and problem["status"] == 408
    assert problem["type"] and problem["title"] and problem["detail"]


async def test_a_trickle_that_never_pauses_long_still_hits_the_total_deadline() -> None:
    receive, _ = _receiver([b"x"] * 1000, delay=0.05, end="hang")  # a byte every 50 ms, for 50 s
    app, sent = await _run(_scope(), receive, deadline=0.3)
    assert app.calls == 0 and sent[0]["status"] == 408


async def test_reversal_408_has_no_idempotency_status() -> None:
    receive, _ = _receiver([b"{"], end="hang")
    _, sent = await _run(_scope("/v1/transactions/abc/reversal"), receive, deadline=0.1)
    assert sent[0]["status"] == 408 and "idempotency-status" not in _headers(sent[0])


async def test_a_client_that_hangs_up_mid_body_reaches_nothing() -> None:
    receive, _ = _receiver([b'{"amount": 12'], end="disconnect")
    app, sent = await _run(_scope(), receive)
    assert app.calls == 0 and sent == []


async def test_a_declared_oversized_body_is_not_read_here() -> None:
    receive, served = _receiver([b"x" * 10, b"y" * 10])
    app, sent = await _run(_scope(content_length=LIMIT + 1), receive)
    assert app.calls == 1 and sent[0]["status"] == 200
    assert app.received[0] == {"type": "http.request", "body": b"x" * 10, "more_body": True}


async def test_an_undeclared_oversized_body_is_handed_over_past_the_limit() -> None:
    chunks = [b"z" * 400] * 10  # 4000 bytes, no Content-Length (chunked)
    receive, _ = _receiver(chunks)
    app, _ = await _run(_scope(), receive)
    first = app.received[0]
    assert LIMIT < len(first["body"]) <= LIMIT + 400 and first["more_body"] is True
    # Buffering stopped past the limit; the rest streams through untouched.
    assert len(first["body"]) == 1200  # three chunks: the first past 1024 bytes
    assert [len(m["body"]) for m in app.received[1:]] == [400] * 7


async def test_lifespan_and_other_scopes_pass_through() -> None:
    seen: list[Any] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(scope["type"])

    async def receive() -> Message:
        raise AssertionError("not read")

    async def send(message: Message) -> None:
        raise AssertionError("not sent")

    await BodyDeadlineMiddleware(app, timeout=0.1, limit=LIMIT)({"type": "lifespan"}, receive, send)
    assert seen == ["lifespan"]
