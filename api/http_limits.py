"""Slow and oversized clients (docs/security.md, "Slow clients").

Two layers, because uvicorn bounds neither the time to send a request nor the size of its
headers:

* ``BodyDeadlineMiddleware`` (pure ASGI, in the app): the whole request body must arrive
  within ``IDEMPAY_BODY_TIMEOUT`` of the end of the headers, else 408 ``request_timeout``
  problem+json and the connection is closed. The body is read here, before any route runs,
  so a slow or truncated body never reaches the idempotency layer: nothing is claimed,
  stored or logged as an error. A client that disconnects mid-body gets nothing (there is
  nobody to answer) and the app is not called.
* ``SlowClientHttpToolsProtocol`` (uvicorn's httptools protocol, used by ``idempay serve``):
  a connection must deliver its request headers within ``IDEMPAY_HEADER_TIMEOUT`` of
  connecting or of the request's first byte (408 problem+json, or a silent close when it
  sent nothing), headers are capped at ``MAX_HEADER_BYTES`` (431 problem+json), a request
  body the app did not need must finish within ``IDEMPAY_BODY_TIMEOUT`` of the response, and
  malformed HTTP is answered 400 problem+json instead of uvicorn's text/plain.
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from typing import Any

import structlog
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from api.errors import PROBLEM_JSON, problem_body
from api.headers import parse_non_negative_int

log = structlog.get_logger("idempay.http_limits")

MAX_HEADER_BYTES = 64 * 1024
"""Request line plus headers, per request (nginx in front allows 4 × 8 KiB by default)."""

LINGER_SECONDS = 2.0
"""How long a refused connection keeps reading (and dropping) before it is closed."""

_REASONS = {400: b"Bad Request", 408: b"Request Timeout", 431: b"Request Header Fields Too Large"}


def _idempotency_status(path: str) -> list[tuple[bytes, bytes]]:
    """Create, lookup and abort always carry ``Idempotency-Status`` (contract §2); a request
    refused before it was read stored nothing under its key."""
    if path.startswith("/v1/transactions") and not path.rstrip("/").endswith("/reversal"):
        return [(b"idempotency-status", b"not_found")]
    return []


class BodyDeadlineMiddleware:
    """Read the whole request body within ``timeout`` seconds, then hand it to the app.

    At most ``limit`` + one chunk is buffered: a larger body is handed over as soon as it
    passes the limit (the routes answer 413 without reading further), and a body whose
    declared ``Content-Length`` is over the limit is not read here at all.
    """

    def __init__(self, app: ASGIApp, *, timeout: float, limit: int) -> None:
        self.app = app
        self.timeout = timeout
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self._declared_too_large(scope):
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        more_body = True
        try:
            async with asyncio.timeout(self.timeout):
                while more_body and size <= self.limit:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        log.info("client_disconnected_mid_body", path=scope.get("path"))
                        return
                    chunk = message.get("body", b"")
                    chunks.append(chunk)
                    size += len(chunk)
                    more_body = bool(message.get("more_body", False))
        except TimeoutError:
            log.warning("request_body_timeout", path=scope.get("path"), received=size)
            await self._send_timeout(scope, send)
            return

        pending: Message | None = {
            "type": "http.request",
            "body": b"".join(chunks),
            "more_body": more_body,
        }

        async def replay() -> Message:
            nonlocal pending
            if pending is not None:
                message, pending = pending, None
                return message
            return await receive()

        await self.app(scope, replay, send)

    def _declared_too_large(self, scope: Scope) -> bool:
        for name, value in scope["headers"]:
            if name == b"content-length":
                declared = parse_non_negative_int(value)
                return declared is not None and declared > self.limit
        return False

    async def _send_timeout(self, scope: Scope, send: Send) -> None:
        body = problem_body(
            408,
            "request_timeout",
            f"The request body did not arrive within {self.timeout:g} s; nothing was processed."
            " Resend it with the same Idempotency-Key.",
        )
        headers = [
            (b"content-type", PROBLEM_JSON.encode()),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
            *_idempotency_status(str(scope.get("path", ""))),
        ]
        await send({"type": "http.response.start", "status": 408, "headers": headers})
        await send({"type": "http.response.body", "body": body})


@functools.cache
def _timeouts() -> tuple[float, float]:
    """(header, body) timeouts, read from the environment once per worker process (uvicorn
    builds the protocol itself, so it cannot be handed the app's Settings)."""
    from api.config import Settings

    settings = Settings()
    return settings.header_timeout, settings.body_timeout


class SlowClientHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a header deadline, a header size cap, a deadline on
    request bodies left unread after the response, and problem+json protocol errors."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.header_timeout, self.body_timeout = _timeouts()
        self._header_timer: asyncio.TimerHandle | None = None
        self._drain_timer: asyncio.TimerHandle | None = None
        self._awaiting_headers = False  # a request has begun and its headers are incomplete
        self._request_seq = 0
        self._header_bytes = 0
        self._refused = False

    # Connection lifecycle
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # lingering after a refusal: read and drop until the close
        counting, seq = self._awaiting_headers, self._request_seq
        super().data_received(data)
        if self._refused or self.transport.is_closing():
            return
        if self._awaiting_headers and self._header_timer is None:
            # Headers still incomplete after this chunk: start their deadline now. (Armed
            # here rather than at the request's first byte, so the usual request, whose
            # headers arrive in one chunk, never creates a timer at all.)
            self._arm_header_timer()
        if counting and self._awaiting_headers and seq == self._request_seq:
            # The whole chunk belongs to this request's (still incomplete) headers.
            self._header_bytes += len(data)
        if self._awaiting_headers and self._header_bytes > MAX_HEADER_BYTES:
            self._refuse(
                431,
                "request_headers_too_large",
                f"The request line and headers are over {MAX_HEADER_BYTES // 1024} KiB.",
            )

    # Parser callbacks
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._awaiting_headers = True
        self._request_seq += 1
        self._header_bytes = 0

    def on_headers_complete(self) -> None:
        self._awaiting_headers = False
        self._header_bytes = 0
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        if self._drain_timer is not None:
            self._drain_timer.cancel()
            self._drain_timer = None
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        cycle = self.cycle
        if cycle is not None and cycle.more_body and not self.transport.is_closing():
            # Answered before the body was read (e.g. 413): the client owes the rest of it
            # before the connection can carry another request.
            self._drain_timer = self.loop.call_later(self.body_timeout, self._on_drain_timeout)

    def send_400_response(self, msg: str) -> None:
        self._refuse(400, "malformed_request", "The request is not valid HTTP/1.1.")

    # Timers
    def _arm_header_timer(self) -> None:
        self._header_timer = self.loop.call_later(self.header_timeout, self._on_header_timeout)

    def _cancel_timers(self) -> None:
        for timer in (self._header_timer, self._drain_timer):
            if timer is not None:
                timer.cancel()
        self._header_timer = self._drain_timer = None

    def _on_header_timeout(self) -> None:
        self._header_timer = None
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            # A pipelined request is late while the previous response is being produced:
            # close once that response is out.
            cycle.keep_alive = False
            return
        if not self._awaiting_headers:
            self.transport.close()  # connected and sent nothing: nobody to answer
            return
        log.warning("request_header_timeout", client=self.client)
        self._refuse(
            408,
            "request_timeout",
            f"The request headers did not arrive within {self.header_timeout:g} s; nothing "
            "was processed. Resend it with the same Idempotency-Key.",
        )

    def _on_drain_timeout(self) -> None:
        self._drain_timer = None
        if not self.transport.is_closing():
            self.transport.close()

    def _refuse(self, status: int, code: str, detail: str) -> None:
        """Answer a request the app never saw, and end the connection."""
        self._cancel_timers()
        self._refused = True
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            # The previous request's answer is still being produced: let it finish, then
            # close (its send would fail on a half-closed transport).
            cycle.keep_alive = False
            return
        body = problem_body(status, code, detail)
        head = [b"HTTP/1.1 %d %s\r\n" % (status, _REASONS[status])]
        for name, value in self.server_state.default_headers:
            head.append(name + b": " + value + b"\r\n")
        head.append(b"content-type: " + PROBLEM_JSON.encode() + b"\r\n")
        head.append(b"content-length: %d\r\n" % len(body))
        head.append(b"x-request-id: " + uuid.uuid4().hex.encode() + b"\r\n")
        head.append(b"connection: close\r\n\r\n")
        self.transport.write(b"".join(head) + body)
        self.flow.resume_reading()
        if self.transport.can_write_eof():
            # Lingering close: send FIN after the answer but keep reading (and dropping) what
            # the client is still sending for a moment. Closing with unread data would send
            # an RST, which can destroy the answer before the client reads it.
            self.transport.write_eof()
            self._drain_timer = self.loop.call_later(LINGER_SECONDS, self._on_drain_timeout)
        else:
            self.transport.close()
