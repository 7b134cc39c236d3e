"""An in-memory fake of the idempay API (contract §2) for ``httpx.MockTransport``.

It stores outcomes by key like the real server, counts how often each key was processed,
and can be told to misbehave per endpoint: ``fake.inject("create", "drop_response")``
makes the next create be processed and its response lost.
"""

from __future__ import annotations

import json
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

import httpx

API_KEY = "sk_test_fake"
CARD = {"token": "tok_visa_4242", "last4": "4242", "brand": "visa"}
FAULTS = (
    "drop_request",
    "lost_in_network",
    "drop_response",
    "expire",
    "clock_skew",
    "advice_too_old",
    "409",
    "429",
    "500",
    "503",
)


@dataclass
class Seen:
    endpoint: str
    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class KeyRecord:
    state: str  # processed | processing | aborted | expired
    fingerprint: str
    transaction: dict[str, Any] | None = None
    polls_left: int = 0
    token: str = ""  # the card token the key was created with (the guard's fingerprint)


@dataclass
class FakeIdempay:
    pending_polls: int = 0  # >0: creates answer 202 and complete after this many lookups
    down: bool = False  # every request fails with a connect error
    blackhole: bool = False  # every request is lost in the network (read timeout)
    keys: dict[str, KeyRecord] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)  # what reached the server
    wire: list[Seen] = field(default_factory=list)  # what the client sent, lost or not
    processed: Counter[str] = field(default_factory=Counter)
    faults: dict[str, deque[str]] = field(default_factory=dict)
    guard: bool = False  # the merchant's duplicate guard (contract §2.2): on, without a window

    def inject(self, endpoint: str, *modes: str) -> None:
        assert all(mode in FAULTS for mode in modes), modes
        self.faults.setdefault(endpoint, deque()).extend(modes)

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def calls(self, endpoint: str) -> list[Seen]:
        return [s for s in self.seen if s.endpoint == endpoint]

    def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/healthz":  # the client's clock sync, not part of a payment
            if self.down or self.blackhole:
                raise httpx.ConnectError("fake: server unreachable", request=request)
            return _json(200, {"status": "ok"})
        endpoint = _endpoint(request)
        body = json.loads(request.content) if request.content else None
        call = Seen(
            endpoint,
            request.method,
            request.url.path,
            {k.lower(): v for k, v in request.headers.items()},
            body,
        )
        self.wire.append(call)
        if self.down:
            raise httpx.ConnectError("fake: server unreachable", request=request)
        if self.blackhole:
            raise httpx.ReadTimeout("fake: lost in the network", request=request)
        queue = self.faults.get(endpoint)
        mode = queue.popleft() if queue else None
        if mode == "drop_request":
            raise httpx.ConnectError("fake: request dropped", request=request)
        if mode == "lost_in_network":
            raise httpx.ReadTimeout("fake: request lost on the way", request=request)
        body = json.loads(request.content) if request.content else None
        self.seen.append(
            Seen(
                endpoint,
                request.method,
                request.url.path,
                {k.lower(): v for k, v in request.headers.items()},
                body,
            )
        )
        if mode == "expire":  # expires_at had passed on arrival: the key is fenced
            self.keys[request.headers["idempotency-key"]] = KeyRecord("expired", "")
            return _problem(410, "request_expired", status_header="expired")
        if mode == "clock_skew":  # the key's time is too far ahead: refused, nothing stored
            return _problem(422, "clock_skew")
        if mode == "advice_too_old":  # an offline advice older than retention: nothing stored
            return _problem(422, "advice_too_old")
        if mode in ("409", "429", "500", "503"):
            return _canned(int(mode))
        response = self._serve(endpoint, request, body)
        if mode == "drop_response":
            raise httpx.ReadTimeout("fake: response lost", request=request)
        return response

    def _serve(self, endpoint: str, request: httpx.Request, body: Any) -> httpx.Response:
        if request.headers.get("authorization") != f"Bearer {API_KEY}":
            return _problem(401, "unauthorized")
        if endpoint == "create":
            return self._create(request, body)
        if endpoint == "list":
            return self._list(request)
        key = request.url.path.split("/")[3]
        record = self.keys.get(key)
        if endpoint == "lookup":
            return self._lookup(key, record)
        if endpoint == "abort":
            return self._abort(key, record)
        return self._reversal(record)

    def _create(self, request: httpx.Request, body: Any) -> httpx.Response:
        key = request.headers.get("idempotency-key")
        if key is None:
            return _problem(400, "idempotency_key_missing")
        # allow_duplicate is the cashier's instruction, not the payment: not fingerprinted
        fingerprint = json.dumps({**body, "allow_duplicate": None}, sort_keys=True)
        record = self.keys.get(key)
        if record is not None:
            if record.state in ("aborted", "expired"):
                code = "transaction_aborted" if record.state == "aborted" else "request_expired"
                return _problem(410, code, status_header=record.state)
            if record.fingerprint != fingerprint:
                return _problem(422, "idempotency_key_reused")
            if record.state == "processing":
                return _problem(409, "request_in_progress", retry_after="1")
            assert record.transaction is not None
            return _json(
                201,
                record.transaction,
                {"Idempotent-Replayed": "true", "Idempotency-Status": "replayed"},
            )
        if body.get("card", {}).get("token", "").isdigit():
            return _problem(422, "pan_not_allowed")
        suspect = self._suspect(body) if self.guard else None
        if suspect is not None:  # refused: nothing stored under the key
            return _problem(409, "suspected_duplicate", duplicate_of=suspect)
        record = KeyRecord("processing", fingerprint, _transaction(key, body))
        record.token = body["card"]["token"]
        self.keys[key] = record
        if self.pending_polls:
            record.polls_left = self.pending_polls
            return _json(202, {"id": key, "status": "processing"}, {"Retry-After": "1"})
        return _json(201, self._complete(key, record), {"Idempotency-Status": "created"})

    def _suspect(self, body: dict[str, Any]) -> str | None:
        """An approved purchase of the same terminal, card, amount and currency under another
        key (the fake's window never ends), unless the body says ``allow_duplicate``."""
        if body.get("type") != "purchase" or body.get("entry_mode") == "offline":
            return None
        if body.get("allow_duplicate") is True:
            return None
        same = ("terminal_id", "amount", "currency")
        for key, record in self.keys.items():
            earlier = record.transaction
            if record.state != "processed" or earlier is None:
                continue
            if earlier["status"] != "approved" or earlier["type"] != "purchase":
                continue
            if all(earlier[name] == body[name] for name in same) and (
                record.token == body["card"]["token"]
            ):
                return key
        return None

    def _list(self, request: httpx.Request) -> httpx.Response:
        """GET /v1/transactions: processed transactions of a terminal, 2 per page."""
        terminal = request.url.params.get("terminal_id")
        rows = [
            record.transaction
            for record in self.keys.values()
            if record.state == "processed"
            and record.transaction is not None
            and record.transaction["terminal_id"] == terminal
        ]
        start = int(request.url.params.get("cursor", "0"))
        more = start + 2 < len(rows)
        page = {"data": rows[start : start + 2], "next_cursor": str(start + 2) if more else None}
        return _json(200, page)

    def _complete(self, key: str, record: KeyRecord) -> dict[str, Any]:
        record.state = "processed"
        self.processed[key] += 1
        assert record.transaction is not None
        return record.transaction

    def _lookup(self, key: str, record: KeyRecord | None) -> httpx.Response:
        if record is None:
            return _problem(404, "not_found", status_header="not_found")
        if record.state in ("aborted", "expired"):
            code = "transaction_aborted" if record.state == "aborted" else "request_expired"
            return _problem(410, code, status_header=record.state)
        if record.state == "processing":
            record.polls_left -= 1
            if record.polls_left > 0:
                return _json(202, {"id": key, "status": "processing"}, {"Retry-After": "1"})
            self._complete(key, record)
        return _json(200, record.transaction)

    def _abort(self, key: str, record: KeyRecord | None) -> httpx.Response:
        if record is None:
            self.keys[key] = KeyRecord("aborted", "")
            return _json(200, {"id": key, "status": "aborted"}, {"Idempotency-Status": "aborted"})
        if record.state == "processing":
            return _problem(409, "request_in_progress", retry_after="1")
        if record.state in ("aborted", "expired"):
            return _json(200, {"id": key, "status": record.state})
        return _json(200, record.transaction, {"Idempotency-Status": "processed"})

    def _reversal(self, record: KeyRecord | None) -> httpx.Response:
        if record is None or record.transaction is None or record.state != "processed":
            return _problem(404, "not_found")
        transaction = record.transaction
        if transaction["status"] == "declined":
            return _problem(422, "not_reversible")
        if transaction["status"] == "approved":
            transaction.update(status="reversed", reversed_at="2026-11-20T12:05:00Z")
        return _json(200, transaction)


def _endpoint(request: httpx.Request) -> str:
    parts = request.url.path.strip("/").split("/")
    if request.method == "POST" and len(parts) == 2:
        return "create"
    if request.method == "GET" and len(parts) == 2:
        return "list"
    if request.method == "GET":
        return "lookup"
    return {"abort": "abort", "reversal": "reversal"}[parts[-1]]


def _transaction(key: str, body: dict[str, Any]) -> dict[str, Any]:
    token = body["card"]["token"]
    declined = token.startswith("tok_decline_")
    return {
        "id": key,
        "status": "declined" if declined else "approved",
        "decline_reason": token.removeprefix("tok_decline_") if declined else None,
        "authorization_code": None if declined else "A1B2C3",
        "terminal_id": body["terminal_id"],
        "type": body["type"],
        "amount": body["amount"],
        "currency": body["currency"],
        "card": {"last4": body["card"]["last4"], "brand": body["card"]["brand"]},
        "installments": body.get("installments", 1),
        "created_at": "2026-11-20T12:00:00Z",
        "processed_at": "2026-11-20T12:00:01Z",
        "reversed_at": None,
        "offline": body.get("entry_mode") == "offline",
    }


_REQUEST_IDS = iter(range(1, 10**9))


def _json(status: int, body: Any, headers: dict[str, str] | None = None) -> httpx.Response:
    all_headers = {"X-Request-Id": f"req_{next(_REQUEST_IDS)}", **(headers or {})}
    return httpx.Response(status, json=body, headers=all_headers)


def _problem(
    status: int,
    code: str,
    *,
    retry_after: str | None = None,
    status_header: str | None = None,
    duplicate_of: str | None = None,
) -> httpx.Response:
    headers = {"Content-Type": "application/problem+json"}
    if retry_after is not None:
        headers["Retry-After"] = retry_after
    if status_header is not None:
        headers["Idempotency-Status"] = status_header
    body = {"type": "about:blank", "title": code, "status": status, "detail": code, "code": code}
    if duplicate_of is not None:
        body["duplicate_of"] = duplicate_of
    return _json(status, body, headers)


def _canned(status: int) -> httpx.Response:
    codes = {409: "request_in_progress", 429: "rate_limited", 503: "service_unavailable"}
    if status in codes:
        return _problem(status, codes[status], retry_after="2")
    return httpx.Response(500, text="Internal Server Error")


class FakeClock:
    """Wall clock under test control: sleeping advances it instantly."""

    def __init__(self, start: float = 1_795_000_000.0) -> None:
        self.now = start
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.sleeps.append(seconds)
        self.now += seconds

    async def async_sleep(self, seconds: float) -> None:
        self.sleep(seconds)
