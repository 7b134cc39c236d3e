"""A scripted server with a clock of its own, for the offline forwarding tests: it judges
``captured_at`` and a UUIDv7 key's time like the real one (422 ``clock_skew`` ahead of its
clock + tolerance; 422 ``advice_too_old`` for an advice older than retention — both store
nothing), keeps keys, answers lookups, and stamps every answer with ``Date`` and
``X-Request-Id`` (so the SDK learns the offset). The link can be up, down (connection
refused) or a black hole (every connect times out after the connect timeout)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import format_datetime
from typing import Any, Literal

import httpx
from fake_idempay import _transaction

Link = Literal["up", "down", "blackhole"]


def uuid7_time(key: str) -> float | None:
    if len(key) != 36 or key[14] != "7":
        return None
    return int(key[:8] + key[9:13], 16) / 1000


def parse_time(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


@dataclass
class Answer:
    key: str
    status: int
    code: str | None
    captured_at: str | None


@dataclass
class World:
    """``device`` is the terminal's clock (its wall and monotonic clock); the server's clock
    is ``device - device_ahead`` (the true time)."""

    device: float = 1_795_000_000.0
    device_ahead: float = 0.0
    tolerance: float = 5.0
    retention: float = 60.0
    link: Link = "up"
    keys: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict)
    answers: list[Answer] = field(default_factory=list)
    processed: dict[str, int] = field(default_factory=dict)
    connect_waits: list[float] = field(default_factory=list)

    # the terminal's clocks
    def clock(self) -> float:
        return self.device

    def sleep(self, seconds: float) -> None:
        self.device += max(0.0, seconds)

    @property
    def server_now(self) -> float:
        return self.device - self.device_ahead

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def creates(self, key: str | None = None) -> list[Answer]:
        return [a for a in self.answers if key is None or a.key == key]

    def handle(self, request: httpx.Request) -> httpx.Response:
        if self.link == "down":
            raise httpx.ConnectError("world: connection refused", request=request)
        if self.link == "blackhole":
            timeout = request.extensions.get("timeout", {}).get("connect")
            assert timeout is not None
            self.connect_waits.append(timeout)
            self.device += timeout
            raise httpx.ConnectTimeout("world: no answer to SYN", request=request)
        self.device += 0.05  # a quick round trip
        path = request.url.path
        if path == "/healthz":
            return self._answer(200, {"status": "ok"})
        if request.method == "POST" and path == "/v1/transactions":
            return self._create(request)
        if request.method == "GET" and path.startswith("/v1/transactions/"):
            key = path.rsplit("/", 1)[1]
            if key not in self.keys:
                return self._problem(404, "not_found")
            return self._answer(200, self.keys[key][1])
        raise AssertionError(f"unexpected {request.method} {path}")

    def _create(self, request: httpx.Request) -> httpx.Response:
        key = request.headers["idempotency-key"]
        body: dict[str, Any] = json.loads(request.content)
        captured = body.get("captured_at")
        fingerprint = json.dumps(body, sort_keys=True)
        if key in self.keys:
            stored_fp, transaction = self.keys[key]
            if stored_fp != fingerprint:
                return self._note(key, captured, self._problem(422, "idempotency_key_reused"))
            return self._note(key, captured, self._answer(201, transaction))
        now = self.server_now
        times = [t for t in (captured and parse_time(captured), uuid7_time(key)) if t]
        if any(t > now + self.tolerance for t in times):
            return self._note(key, captured, self._problem(422, "clock_skew"))
        if any(t < now - self.retention for t in times):
            if body.get("entry_mode") == "offline":
                return self._note(key, captured, self._problem(422, "advice_too_old"))
            return self._note(key, captured, self._problem(410, "request_expired"))
        transaction = _transaction(key, body)
        self.keys[key] = (fingerprint, transaction)
        self.processed[key] = self.processed.get(key, 0) + 1
        return self._note(key, captured, self._answer(201, transaction))

    def _note(self, key: str, captured: str | None, response: httpx.Response) -> httpx.Response:
        code = None
        if response.status_code >= 400:
            code = response.json()["code"]
        self.answers.append(Answer(key, response.status_code, code, captured))
        return response

    def _answer(
        self, status: int, body: Any, headers: dict[str, str] | None = None
    ) -> httpx.Response:
        date = format_datetime(datetime.fromtimestamp(int(self.server_now), UTC), usegmt=True)
        all_headers = {"Date": date, "X-Request-Id": "req-world", **(headers or {})}
        return httpx.Response(status, json=body, headers=all_headers)

    def _problem(self, status: int, code: str) -> httpx.Response:
        body = {"type": "about:blank", "title": code, "status": status, "detail": code}
        body["code"] = code
        headers = {"Content-Type": "application/problem+json", "Idempotency-Status": "not_found"}
        return self._answer(status, body, headers)
