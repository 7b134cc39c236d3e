"""``idempay simulate --outage``'s pieces: the link that refuses every connection during the
outage (and only then), the seeded share of the fleet it hits, and the invariants' reading of
a stored sale the server refused (REPORTED: never processed)."""

from __future__ import annotations

import httpx
import pytest

from client_sdk import JournalState
from idempay_tools.invariants import _journal_outcome
from idempay_tools.simulate_outage import OutageLink, in_outage


def test_the_link_refuses_connections_only_during_the_outage() -> None:
    now = [99.0]
    served = httpx.MockTransport(lambda request: httpx.Response(200))
    link = OutageLink(served, start=100.0, seconds=5.0, clock=lambda: now[0])
    request = httpx.Request("GET", "http://idempay.test/healthz")
    assert link.handle_request(request).status_code == 200
    now[0] = 100.0
    with pytest.raises(httpx.ConnectError):  # nothing sent: a sale may go offline
        link.handle_request(request)
    now[0] = 105.0
    assert link.handle_request(request).status_code == 200
    assert link.stats == {"outage_refused": 1}


def test_the_outage_hits_a_seeded_share_of_the_fleet() -> None:
    hit = [i for i in range(10) if in_outage(5, i, 10, 0.5)]
    assert len(hit) == 5 and hit == [i for i in range(10) if in_outage(5, i, 10, 0.5)]
    assert sum(in_outage(5, i, 3, 0.01) for i in range(3)) == 1  # at least one terminal


def test_the_invariants_read_a_refused_stored_sale_as_never_processed() -> None:
    assert _journal_outcome(JournalState.REPORTED, {"kind": "error"}) == "refused"
    assert _journal_outcome(JournalState.STORED, {"kind": "stored"}) == "open"
