"""The SDK's estimate of the server clock (``Date`` header, NTP-style): quick round trips
set it, an answer the network held for seconds does not, and ``captured_at``,
``expires_at`` and the key's UUIDv7 time follow it."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from email.utils import format_datetime
from pathlib import Path

import httpx
import pytest

from client_sdk import APIError, Client, NotFoundError

UNKNOWN = "01a1ee56-5e00-7d97-86ac-d904da6cff77"
START = 1_795_000_000.0  # the terminal's clock at the start
SERVER_AHEAD_S = 300.0


class World:
    """A terminal clock, and a server 300 s ahead whose answers take ``delay`` seconds."""

    def __init__(self) -> None:
        self.now = START
        self.delay = 0.1
        self.bodies: list[dict[str, object]] = []

    def clock(self) -> float:
        return self.now

    def handle(self, request: httpx.Request) -> httpx.Response:
        if request.content:
            self.bodies.append(json.loads(request.content))
        server = datetime.fromtimestamp(self.now + SERVER_AHEAD_S, UTC)
        self.now += self.delay
        status, code = (422, "validation_error") if request.content else (404, "not_found")
        problem = {"type": "about:blank", "title": code, "status": status,
                   "detail": "a fake answer", "code": code}  # fmt: skip
        return httpx.Response(
            status,
            json=problem,
            headers={
                "Date": format_datetime(server, usegmt=True),
                "X-Request-Id": "req-fake",
                "Content-Type": "application/problem+json",
                "Idempotency-Status": "not_found",
            },  # fmt: skip
        )


def _client(world: World, tmp_path: Path) -> Client:
    return Client(
        "http://idempay.test",
        "idp_test",
        terminal_id="T-CLOCK",
        journal=tmp_path / "pos.db",
        transport=httpx.MockTransport(world.handle),
        clock=world.clock,
        sleep=lambda seconds: None,
    )


def test_a_quick_round_trip_sets_the_server_clock_estimate(tmp_path: Path) -> None:
    world = World()
    with _client(world, tmp_path) as pos:
        with pytest.raises(NotFoundError):
            pos.lookup(UNKNOWN)
        assert pos.clock_offset_s is not None
        assert abs(pos.clock_offset_s - SERVER_AHEAD_S) <= 1.0


def test_an_answer_held_for_seconds_is_not_a_clock_sample(tmp_path: Path) -> None:
    world = World()
    world.delay = 5.0
    with _client(world, tmp_path) as pos:
        with pytest.raises(NotFoundError):
            pos.lookup(UNKNOWN)
        assert pos.clock_offset_s is None


def test_expires_at_is_set_on_the_estimated_server_clock(tmp_path: Path) -> None:
    world = World()
    with _client(world, tmp_path) as pos:
        with pytest.raises(NotFoundError):
            pos.lookup(UNKNOWN)
        with pytest.raises(APIError):  # the fake refuses the create: one attempt
            pos.purchase(
                amount=100,
                currency="BRL",
                card={"token": "tok_visa_4242", "last4": "4242", "brand": "visa"},
                deadline_s=30,
            )
        [entry] = pos.journal.entries()
    body = world.bodies[0]
    expires = datetime.fromisoformat(str(body["expires_at"])).timestamp()
    captured = datetime.fromisoformat(str(body["captured_at"])).timestamp()
    # both on the server's clock (contract §4): captured_at too, 300 s ahead of the device's
    assert abs(captured - (world.now + SERVER_AHEAD_S)) <= 1.0
    assert abs(expires - (captured + 30)) <= 1.0  # server clock + deadline
    assert abs((uuid.UUID(entry.key).int >> 80) / 1000 - captured) <= 1.0  # UUIDv7 time
