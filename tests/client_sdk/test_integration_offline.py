"""Store and forward against the real server, on Postgres and on SQLite (issue 16).

The terminal's link is a real one that can be cut: while it is down every request goes to a
port nobody listens on, so the connection is refused by the operating system, as it is when
a POS's link is gone. Each rule of contract §4.12 is checked in the server's database:
a payment sold offline is processed exactly once when forwarded (as an advice: the
transaction says ``offline``), a declined advice is reported, an advice too old is refused
and kept, a stored key is never aborted, two drivers never both forward, and a terminal that
lost its journal reconciles from the listing.
"""

from __future__ import annotations

import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from integration_db import Merchant, wait_for

from client_sdk import (
    AdviceTooOldError,
    Client,
    JournalState,
    OfflinePolicy,
    RetryPolicy,
    StoredPaymentError,
    Transaction,
)
from idempay_tools.serve_process import free_port
from tests.support.backend import Backend
from tests.support.client import Api
from tests.support.services import Server

CARD = {"token": "tok_visa_4242", "last4": "4242", "brand": "visa"}
POLICY = OfflinePolicy(
    floor_limit=5000, max_stored_count=5, max_stored_amount=20_000, max_age_s=600
)


class Link(httpx.BaseTransport):
    """The terminal's link: while ``down``, each request is sent to a port nobody listens
    on (the connection is refused); ``hold`` blocks advices (creates carrying
    ``entry_mode: offline``) until it is set again."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.down = False
        self.dead_port = free_port()
        self.hold = threading.Event()
        self.hold.set()
        self.holding = threading.Event()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if self.down:
            request.url = request.url.copy_with(port=self.dead_port)
        elif b'"entry_mode":"offline"' in request.read() and not self.hold.is_set():
            self.holding.set()
            self.hold.wait(30)
        return self.inner.handle_request(request)

    def close(self) -> None:
        self.inner.close()


def terminal(
    server: Server, merchant: Merchant, journal: Path, link: Link, **options: Any
) -> Client:
    return Client(
        server.url,
        merchant.api_key,
        terminal_id=options.pop("terminal_id", "T-OFF"),
        journal=journal,
        transport=link,
        timeout=5.0,
        retry=RetryPolicy(base=0.02, cap=0.2),
        offline=options.pop("offline", POLICY),
        **options,
    )


def offline_of(backend: Backend, merchant: Merchant, key: str) -> bool:
    [(offline,)] = backend.sql(
        'SELECT offline FROM "transaction" WHERE merchant_id = :m AND id = :k',
        m=merchant.id,
        k=key,
    )
    return bool(offline)


def created_once(merchant: Merchant, key: str) -> list[tuple[str, int, int | None]]:
    return wait_for(
        lambda: [e for e in merchant.create_events(key)] or None,
        timeout=10,
        what=f"the create events of {key}",
    )


def test_a_sale_without_a_link_is_forwarded_exactly_once_when_it_is_back(
    backend: Backend, server: Server, tmp_path: Path
) -> None:
    merchant = Merchant.create(backend, f"offline-{uuid.uuid4().hex[:8]}")
    link = Link()
    link.down = True
    with terminal(server, merchant, tmp_path / "pos.db", link) as pos:
        sold = pos.purchase(amount=1250, currency="BRL", card=CARD, deadline_s=30)
        assert sold.offline and sold.status == "approved"
        assert pos.journal.get(sold.id).state is JournalState.STORED  # type: ignore[union-attr]
        assert merchant.key_states() == {}  # the server never heard of it
        attempts = pos.journal.get(sold.id).attempts  # type: ignore[union-attr]

        link.down = False
        online = pos.purchase(amount=990, currency="BRL", card=CARD, deadline_s=30)
        assert online.status == "approved" and online.offline is False
        entry = pos.journal.get(sold.id)
        assert entry is not None and entry.state is JournalState.RESOLVED
        assert pos.recover() == [] and pos.forward() == []

    assert merchant.transactions() == {sold.id: "approved", online.id: "approved"}
    assert merchant.charges() == {sold.id: 1, online.id: 1}
    assert offline_of(backend, merchant, sold.id) and not offline_of(backend, merchant, online.id)
    assert created_once(merchant, sold.id) == [("created", 201, attempts + 1)]
    assert Api(server.url, merchant.api_key).lookup(sold.id).json()["offline"] is True


def test_an_advice_the_issuer_declines_is_reported(
    backend: Backend, server: Server, tmp_path: Path
) -> None:
    merchant = Merchant.create(backend, f"offline-decline-{uuid.uuid4().hex[:8]}")
    declined: list[Transaction] = []
    link = Link()
    link.down = True
    card = {**CARD, "token": "tok_decline_insufficient_funds"}
    with terminal(
        server, merchant, tmp_path / "pos.db", link, on_offline_decline=declined.append
    ) as pos:
        sold = pos.purchase(amount=1250, currency="BRL", card=card, deadline_s=30)
        link.down = False
        [forwarded] = pos.forward()
    assert forwarded.state is JournalState.RESOLVED
    assert [(t.id, t.status, t.decline_reason, t.offline) for t in declined] == [
        (sold.id, "declined", "insufficient_funds", True)
    ]
    assert merchant.transactions() == {sold.id: "declined"}
    assert merchant.charges() == {}
    assert offline_of(backend, merchant, sold.id)


def test_an_advice_older_than_the_retention_window_is_refused_and_kept(
    backend: Backend, tmp_path: Path
) -> None:
    short = backend.server(IDEMPAY_TOMBSTONE_RETENTION="3s", IDEMPAY_CLOCK_SKEW_TOLERANCE="0s")
    merchant = Merchant.create(backend, f"offline-old-{uuid.uuid4().hex[:8]}")
    errors: list[Exception] = []
    link = Link()
    link.down = True
    try:
        with terminal(
            short, merchant, tmp_path / "pos.db", link, on_offline_error=errors.append
        ) as pos:
            sold = pos.purchase(amount=1250, currency="BRL", card=CARD, deadline_s=30)
            time.sleep(3.5)
            link.down = False
            [reported] = pos.forward()
            assert reported.state is JournalState.REPORTED
            assert isinstance(reported.error, AdviceTooOldError)
            assert [type(e) for e in errors] == [AdviceTooOldError]
            entry = pos.journal.get(sold.id)
            assert entry is not None and entry.state is JournalState.REPORTED
            assert pos.recover() == []
    finally:
        short.stop()
    assert merchant.key_states() == {} and merchant.transactions() == {}  # nothing stored
    assert [e[:2] for e in created_once(merchant, sold.id)] == [("rejected", 422)]


def test_an_abort_of_a_stored_key_is_refused_and_the_key_is_not_fenced(
    backend: Backend, server: Server, tmp_path: Path
) -> None:
    merchant = Merchant.create(backend, f"offline-abort-{uuid.uuid4().hex[:8]}")
    link = Link()
    link.down = True
    with terminal(server, merchant, tmp_path / "pos.db", link) as pos:
        sold = pos.purchase(amount=1250, currency="BRL", card=CARD, deadline_s=30)
        link.down = False
        with pytest.raises(StoredPaymentError):
            pos.abort(sold.id)
        assert merchant.key_states() == {}  # never fenced
        assert Api(server.url, merchant.api_key).lookup(sold.id).status_code == 404
        [forwarded] = pos.recover()  # recover forwards it, it does not fence it
    assert forwarded.state is JournalState.RESOLVED
    assert merchant.key_states() == {sold.id: "completed"}
    assert merchant.charges() == {sold.id: 1}


def test_a_forward_racing_a_reconnect_is_sent_once(
    backend: Backend, server: Server, tmp_path: Path
) -> None:
    """Two drivers on one journal when the link comes back: ``forward()`` holds the stored
    payment's lease while its advice is on the way; the next sale on another client finds
    it held and leaves it — exactly one advice reaches the server."""
    merchant = Merchant.create(backend, f"offline-race-{uuid.uuid4().hex[:8]}")
    journal = tmp_path / "pos.db"
    link, other_link = Link(), Link()
    link.down = True
    with (
        terminal(server, merchant, journal, link) as first,
        terminal(server, merchant, journal, other_link) as second,
    ):
        sold = first.purchase(amount=1250, currency="BRL", card=CARD, deadline_s=30)
        link.down = False
        link.hold.clear()
        results: list[Any] = []
        forwarding = threading.Thread(target=lambda: results.append(first.forward()))
        forwarding.start()
        assert link.holding.wait(10)  # the advice is held on the wire, its lease taken
        online = second.purchase(amount=990, currency="BRL", card=CARD, deadline_s=30)
        assert online.status == "approved" and not online.offline
        assert merchant.create_events(sold.id) == []  # the reconnect left it to its driver
        link.hold.set()
        forwarding.join(30)
        [[forwarded]] = results
        assert forwarded.state is JournalState.RESOLVED
        assert second.forward() == []
    assert created_once(merchant, sold.id) == [
        ("created", 201, forwarded_attempts(journal, sold.id))
    ]
    assert merchant.charges() == {sold.id: 1, online.id: 1}


def forwarded_attempts(journal: Path, key: str) -> int:
    from client_sdk import Journal

    with Journal(journal) as opened:
        entry = opened.get(key)
    assert entry is not None
    return entry.attempts


def test_a_terminal_that_lost_its_journal_reconciles_from_the_listing(
    backend: Backend, server: Server, tmp_path: Path
) -> None:
    merchant = Merchant.create(backend, f"offline-swap-{uuid.uuid4().hex[:8]}")
    neighbour = Merchant.create(backend, f"offline-neighbour-{uuid.uuid4().hex[:8]}")
    since = datetime.now(UTC) - timedelta(seconds=5)
    link = Link()
    with terminal(server, neighbour, tmp_path / "other.db", link) as theirs:
        theirs.purchase(amount=77, currency="BRL", card=CARD)  # same terminal id, other merchant
    link.down = True
    with terminal(server, merchant, tmp_path / "pos.db", link) as pos:
        sold = pos.purchase(amount=1250, currency="BRL", card=CARD, deadline_s=30)
        link.down = False
        paid = [pos.purchase(amount=100 + i, currency="BRL", card=CARD).id for i in range(3)]
    with terminal(server, merchant, tmp_path / "swapped.db", link) as swapped:
        found = swapped.reconcile(since=since, page_size=2)
    assert [t.id for t in found] == [sold.id, *paid]
    assert [t.offline for t in found] == [True, False, False, False]
