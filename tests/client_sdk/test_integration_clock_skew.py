"""A terminal whose clock is minutes behind: ``expires_at`` is a deadline the server checks
against its own clock, so the SDK estimates the server's clock from the ``Date`` header
and sets ``expires_at`` on it. Only a payment started before the terminal has heard from
the server can carry a stale ``expires_at``; the server then fences it as expired (never
processed) — the chaos harness found a skewed terminal refused on every payment before
this."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from integration_db import Merchant

from client_sdk import Client, PaymentAborted
from tests.support.backend import Backend
from tests.support.services import Server

CARD = {"token": "tok_visa_4242", "last4": "4242", "brand": "visa"}
SKEW_S = -180.0  # the terminal's clock is three minutes behind


@pytest.fixture(scope="module")
def server(pg_backend: Backend) -> Iterator[Server]:
    running = pg_backend.server()
    yield running
    running.stop()


def test_a_terminal_clock_minutes_behind_still_pays_once_it_has_heard_the_server(
    pg_backend: Backend, server: Server, tmp_path: Path
) -> None:
    merchant = Merchant.create(pg_backend, f"skew-{uuid.uuid4().hex[:8]}")
    with Client(
        server.url,
        merchant.api_key,
        terminal_id="T-SKEW",
        journal=tmp_path / "pos.db",
        clock=lambda: time.time() + SKEW_S,
    ) as pos:
        assert pos.clock_offset_s is None
        with pytest.raises(PaymentAborted) as first:  # expires_at is 150 s in the past
            pos.purchase(amount=1000, currency="BRL", card=CARD, deadline_s=30)
        assert (first.value.reason, first.value.code) == ("expired", "request_expired")
        assert pos.clock_offset_s is not None
        assert abs(pos.clock_offset_s + SKEW_S) < 3.0  # the server is ~180 s ahead
        paid = [pos.purchase(amount=1000 + i, currency="BRL", card=CARD) for i in range(3)]
    assert [p.status for p in paid] == ["approved"] * 3
    assert merchant.transactions() == {p.id: "approved" for p in paid}
    assert first.value.key not in merchant.transactions()
    assert merchant.charges() == {p.id: 1 for p in paid}


def test_a_terminal_clock_ahead_keeps_its_device_time_in_captured_at(
    pg_backend: Backend, server: Server, tmp_path: Path
) -> None:
    merchant = Merchant.create(pg_backend, f"skew-{uuid.uuid4().hex[:8]}")
    with Client(
        server.url,
        merchant.api_key,
        terminal_id="T-AHEAD",
        journal=tmp_path / "pos.db",
        clock=lambda: time.time() + 600.0,
    ) as pos:
        first = pos.purchase(amount=500, currency="BRL", card=CARD)
        second = pos.purchase(amount=501, currency="BRL", card=CARD)
        offset = pos.clock_offset_s
        entries = {e.key: e.request_json for e in pos.journal.entries()}
    assert (first.status, second.status) == ("approved", "approved")
    assert offset is not None and abs(offset + 600.0) < 3.0
    sent = json.loads(entries[second.id])
    captured, expires = sent["captured_at"], sent["expires_at"]
    # captured_at stays the device's own time (the audit wants what the terminal saw);
    # expires_at is on the server's clock: ~10 minutes earlier than the device's.
    gap = datetime.fromisoformat(captured) - datetime.fromisoformat(expires)
    assert 500 < gap.total_seconds() < 600
