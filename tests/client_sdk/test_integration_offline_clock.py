"""Store and forward with the terminal's clock 90 s ahead, against the real server (retention
60 s, tolerance 5 s) on Postgres and SQLite — the review of issue 16, finding 1 (s5): one
stored advice the server refuses ``clock_skew`` must not hold back the sales stored behind
it until they are too old; and a sale stored before the SDK knew the server's time is
re-stamped (same key) once a refusal and a 404 lookup prove the server never processed it.
"""

from __future__ import annotations

import json
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

from integration_db import Merchant
from test_integration_offline import Link

from client_sdk import Client, ClockSkewError, JournalState, OfflinePolicy, RetryPolicy
from tests.support.backend import Backend
from tests.support.client import Api

CARD = {"token": "tok_visa_4242", "last4": "4242", "brand": "visa"}
AHEAD_S = 90.0
POLICY = OfflinePolicy(
    floor_limit=5000, max_stored_count=5, max_stored_amount=20_000, max_age_s=600
)


def terminal(url: str, api_key: str, journal: Path, link: Link, **options: Any) -> Client:
    return Client(
        url,
        api_key,
        terminal_id="T-AHEAD",
        journal=journal,
        transport=link,
        timeout=5.0,
        retry=RetryPolicy(base=0.02, cap=0.2),
        offline=POLICY,
        clock=lambda: time.time() + AHEAD_S,
        **options,
    )


def sell(pos: Client, amount: int) -> Any:
    return pos.purchase(amount=amount, currency="BRL", card=CARD, deadline_s=30)


def from_another_boot(pos: Client, key: str) -> None:
    """The entry was stored by an earlier boot: its monotonic time means nothing now."""
    entry = pos.journal.get(key)
    assert entry is not None and entry.outcome is not None
    if "clock" not in entry.outcome:  # an SDK that keeps no stamp cannot re-stamp anyway
        return
    outcome = {**entry.outcome, "clock": {**entry.outcome["clock"], "epoch": "earlier-boot"}}
    with pos.journal._open():
        pos.journal._db.execute(
            "UPDATE journal_entry SET outcome = ? WHERE key = ?", (json.dumps(outcome), key)
        )


def test_a_stuck_advice_does_not_hold_back_the_sales_stored_behind_it(
    backend: Backend, tmp_path: Path
) -> None:
    server = backend.server(IDEMPAY_TOMBSTONE_RETENTION="60s", IDEMPAY_CLOCK_SKEW_TOLERANCE="5s")
    merchant = Merchant.create(backend, f"ahead-{uuid.uuid4().hex[:8]}")
    link = Link()
    try:
        link.down = True
        with terminal(server.url, merchant.api_key, tmp_path / "pos.db", link) as first:
            stuck = sell(first, 1000)  # stamped 90 s ahead: no server time known yet
            assert stuck.offline
            from_another_boot(first, stuck.id)  # so it cannot be re-stamped
        link.down = False
        with terminal(server.url, merchant.api_key, tmp_path / "pos.db", link) as pos:
            online = sell(pos, 1200)  # teaches the offset; its forward pass: A refused
            assert not online.offline and pos.clock_offset_s is not None
            link.down = True
            behind = sell(pos, 1100)  # stored on the corrected clock
            assert behind.offline
            link.down = False
            started = time.monotonic()
            results = {r.key: r for r in pos.forward()}
            took = time.monotonic() - started
        assert results[behind.id].state is JournalState.RESOLVED, results[behind.id].error
        assert results[stuck.id].state is JournalState.STORED
        assert isinstance(results[stuck.id].error, ClockSkewError)
        assert took < 10  # in the same pass, not ~85 s later when A stops being ahead
        assert merchant.transactions() == {online.id: "approved", behind.id: "approved"}
        assert merchant.charges() == {online.id: 1, behind.id: 1}
        assert Api(server.url, merchant.api_key).lookup(stuck.id).status_code == 404
    finally:
        server.stop()
        link.close()


def test_a_sale_stored_before_the_offset_was_known_is_restamped_under_its_key(
    backend: Backend, tmp_path: Path
) -> None:
    server = backend.server(IDEMPAY_TOMBSTONE_RETENTION="60s", IDEMPAY_CLOCK_SKEW_TOLERANCE="5s")
    merchant = Merchant.create(backend, f"restamp-{uuid.uuid4().hex[:8]}")
    link = Link()
    try:
        with terminal(server.url, merchant.api_key, tmp_path / "pos.db", link) as pos:
            link.down = True
            sold = sell(pos, 1000)
            assert sold.offline
            stamped = pos.journal.get(sold.id).request["captured_at"]  # type: ignore[union-attr]
            link.down = False
            online = sell(pos, 1200)  # forwards A first: clock_skew → 404 → re-stamp → 201
            entry = pos.journal.get(sold.id)
            assert entry is not None and entry.state is JournalState.RESOLVED
            assert entry.outcome is not None and entry.outcome["restamped"]["from"] == stamped
        assert uuid.UUID(sold.id).version == 4  # no server time was known: no UUIDv7 claim
        body = Api(server.url, merchant.api_key).lookup(sold.id).json()
        assert body["offline"] is True
        assert merchant.transactions() == {sold.id: "approved", online.id: "approved"}
        assert merchant.charges() == {sold.id: 1, online.id: 1}
        restamped = datetime.fromisoformat(entry.outcome["restamped"]["to"].replace("Z", "+00:00"))
        was = datetime.fromisoformat(stamped.replace("Z", "+00:00"))
        assert 85 <= (was - restamped).total_seconds() <= 95
        events = merchant.create_events_of_a_retry(sold.id)
        assert events == [("rejected", 422), ("created", 201)]  # the same key both times
    finally:
        server.stop()
        link.close()
