"""A terminal whose clock is minutes behind: ``expires_at`` is a deadline the server checks
against its own clock, so the SDK estimates the server's clock from the ``Date`` header
and sets ``expires_at`` on it. Only a payment started before the terminal has heard from
the server can carry a stale ``expires_at``; the server then fences it as expired (never
processed) — the chaos harness found a skewed terminal refused on every payment before
this. ``captured_at`` and the UUIDv7 key time follow the same estimate (issue 14 item 6:
a terminal 40 days behind was refused on every payment)."""

from __future__ import annotations

import json
import time
import uuid
from datetime import datetime
from pathlib import Path

import pytest
from integration_db import Merchant

from client_sdk import NotFoundError
from tests.support.backend import Backend
from tests.support.services import Server

CARD = {"token": "tok_visa_4242", "last4": "4242", "brand": "visa"}
SKEW_S = -180.0  # the terminal's clock is three minutes behind


@pytest.mark.parametrize(
    "skew_s",
    [SKEW_S, 900.0, -40 * 86_400.0],
    ids=["3-min-behind", "15-min-ahead", "40-days-behind"],
)
def test_a_terminal_booting_with_its_clock_off_sells_its_very_first_payment(
    pg_backend: Backend, pg_server: Server, tmp_path: Path, skew_s: float
) -> None:
    """contract §4: a terminal whose clock is off still sells — its first payment after a boot
    too. A new client used to mint the first key and captured_at on the raw device clock:
    3 min behind → 410 request_expired (expires_at in the past), 15 min ahead → 422
    clock_skew (the make chaos run saw it on each reboot), 40 days behind → 410."""
    merchant = Merchant.create(pg_backend, f"skew-{uuid.uuid4().hex[:8]}")
    with merchant.client(
        pg_server.url, "T-SKEW", tmp_path / "pos.db", clock=lambda: time.time() + skew_s
    ) as pos:
        assert pos.clock_offset_s is None
        first = pos.purchase(amount=1000, currency="BRL", card=CARD, deadline_s=30)
        assert pos.clock_offset_s is not None
        assert abs(pos.clock_offset_s + skew_s) < 3.0
        paid = [
            first,
            *(pos.purchase(amount=1001 + i, currency="BRL", card=CARD) for i in range(2)),
        ]
    assert [p.status for p in paid] == ["approved"] * 3
    assert merchant.transactions() == {p.id: "approved" for p in paid}
    assert merchant.charges() == {p.id: 1 for p in paid}


def test_a_terminal_clock_ahead_sends_every_time_on_the_servers_clock(
    pg_backend: Backend, pg_server: Server, tmp_path: Path
) -> None:
    """contract §4: captured_at, expires_at and the UUIDv7 time all follow the learned offset
    (the server refuses a captured_at or key time too far ahead: 422 clock_skew)."""
    merchant = Merchant.create(pg_backend, f"skew-{uuid.uuid4().hex[:8]}")
    with merchant.client(
        pg_server.url, "T-AHEAD", tmp_path / "pos.db", clock=lambda: time.time() + 600.0
    ) as pos:
        with pytest.raises(NotFoundError):  # any answer teaches the SDK the server's clock
            pos.lookup(str(uuid.uuid4()))
        first = pos.purchase(amount=500, currency="BRL", card=CARD)
        offset = pos.clock_offset_s
        sent = json.loads(pos.journal.get(first.id).request_json)  # type: ignore[union-attr]
    assert first.status == "approved"
    assert offset is not None and abs(offset + 600.0) < 3.0
    captured = datetime.fromisoformat(sent["captured_at"])
    expires = datetime.fromisoformat(sent["expires_at"])
    key_ms = uuid.UUID(first.id).int >> 80
    assert abs(captured.timestamp() - time.time()) < 60  # the server's time, not +600 s
    assert abs((expires - captured).total_seconds() - 60.0) < 1.0  # deadline_s default
    assert abs(key_ms / 1000 - captured.timestamp()) < 1.0


def test_a_terminal_clock_forty_days_behind_sells_once_it_has_heard_the_server(
    pg_backend: Backend, pg_server: Server, tmp_path: Path
) -> None:
    """Issue 14 item 6: captured_at used to be the raw device clock — 40 days old, past
    the retention window — so every payment was fenced as expired."""
    merchant = Merchant.create(pg_backend, f"skew-{uuid.uuid4().hex[:8]}")
    with merchant.client(
        pg_server.url, "T-BEHIND", tmp_path / "pos.db", clock=lambda: time.time() - 40 * 86_400.0
    ) as pos:
        with pytest.raises(NotFoundError):
            pos.lookup(str(uuid.uuid4()))
        paid = [pos.purchase(amount=700 + i, currency="BRL", card=CARD) for i in range(2)]
    assert [p.status for p in paid] == ["approved"] * 2
    assert merchant.transactions() == {p.id: "approved" for p in paid}
    assert merchant.charges() == {p.id: 1 for p in paid}
