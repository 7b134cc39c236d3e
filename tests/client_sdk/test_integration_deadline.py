"""A payment deadline shorter than the acquirer's latency ends in abort, against the real
server on Postgres; the original request, held by the chaos proxy and released after the
abort, is refused with 410 and never charged.

Timeline (server: the acquirer answers after 12 s, the create gives up waiting after 1.5 s
and the 0200 is in doubt only after 20 s; SDK: 1 s per request, deadline 2.5 s): the
original create is held in the network → the terminal times out, looks up (404) and resends
with the same key → the server claims it and sends its one 0200 → the terminal times out
again, looks up (202) → deadline → abort (409 until ``IDEMPAY_ANSWER_WITHIN`` + 0.5 s after
the claim, then the abort takes the key over and fences it, queuing the 0420 of its 0200)
→ ``PaymentAbortedError``. The acquirer's approval is reversed by that advice; the late 0210
changes nothing. Then the original arrives: 410.

The server has a database of its own, and its acquirer is far slower than the deadline
(12 s vs 2.5 s): the test once failed because another module's server, sharing the session
database, finished this key from its completer before the abort — right for that server,
wrong for this test's premise.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from integration_db import Merchant, journal_entries, wait_for

from api.acquirer.host import store
from api.acquirer.messages import rrn_for
from api.config import Settings
from client_sdk import Client, JournalState, PaymentAbortedError, RetryPolicy
from idempay_tools.chaos_proxy import ChaosProxy, ProxyThread
from tests.support.backend import Backend
from tests.support.services import Server

ISSUER_SLOW_S = 12.0
ACQUIRER_TIMEOUT_S = 20.0  # the 0200 is still awaited when the abort fences its key
DEADLINE_S = 2.5
HOLD_ORIGINAL_S = 16.0
SLOW_CARD = {"token": "tok_issuer_slow", "last4": "0002", "brand": "visa"}


@pytest.fixture
def slow_issuer_server(private_pg_backend: Backend) -> Iterator[Server]:
    # A database of its own: another module's server (acquirer 0.8 s) once finished this
    # key from its completer before the abort.
    server = private_pg_backend.server(
        IDEMPAY_ACQUIRER_SLOW_SECONDS=str(ISSUER_SLOW_S),
        IDEMPAY_ACQUIRER_TIMEOUT=str(ACQUIRER_TIMEOUT_S),
    )
    yield server
    server.stop()


@pytest.fixture
def proxy(slow_issuer_server: Server) -> Iterator[ProxyThread]:
    thread = ChaosProxy(
        target_host="127.0.0.1", target_port=slow_issuer_server.port, loss=0.0
    ).run_in_thread()
    yield thread
    thread.stop()


def test_a_deadline_shorter_than_the_issuer_aborts_and_the_late_original_is_refused(
    private_pg_backend: Backend, proxy: ProxyThread, tmp_path: Path
) -> None:
    pg_backend = private_pg_backend
    merchant = Merchant.create(pg_backend, f"deadline-{uuid.uuid4().hex[:8]}")
    proxy.hold_next(seconds=HOLD_ORIGINAL_S, match="POST /v1/transactions ")
    journal = tmp_path / "pos.db"
    with Client(
        f"http://127.0.0.1:{proxy.port}",
        merchant.api_key,
        terminal_id="T-DEADLINE",
        journal=journal,
        timeout=1.0,
        retry=RetryPolicy(base=0.02, cap=0.2),
        abort_grace_s=30.0,
        send_expires_at=False,  # only the fence may stop the late original
    ) as pos:
        started = time.monotonic()
        with pytest.raises(PaymentAbortedError) as caught:
            pos.purchase(amount=9900, currency="BRL", card=SLOW_CARD, deadline_s=DEADLINE_S)
        elapsed = time.monotonic() - started
    key = caught.value.key
    assert caught.value.reason == "aborted"
    assert DEADLINE_S <= elapsed < HOLD_ORIGINAL_S
    [entry] = journal_entries(journal)
    assert (entry.key, entry.state) == (key, JournalState.ABORTED)
    assert entry.attempts == 2  # the held original and one resend, same key
    assert proxy.released == [], "the original must still be held in the network"

    wait_for(lambda: proxy.released, timeout=HOLD_ORIGINAL_S + 10, what="the held original")
    assert [(r.request_line.split(" ")[0], r.status) for r in proxy.released] == [("POST", 410)]

    assert merchant.key_states() == {key: "aborted"}
    assert merchant.transactions() == {}
    assert merchant.charges() == {}
    # the resend reached the slow issuer (202: still waiting); the late original hit the fence
    wait_for(
        lambda: merchant.create_events(key) == [("created", 202, 2), ("aborted", 410, 1)],
        timeout=10,
        what=f"create events, saw {merchant.create_events(key)}",
    )
    # the one 0200 (the resend's) was approved by the acquirer and reversed by the abort's
    # advice, acknowledged: nothing stays authorized for a fenced key
    rrn = rrn_for(Settings().secret_key.encode(), merchant.id, key)
    wait_for(
        lambda: advice_of(pg_backend, merchant.id, key) == ("abort", rrn, True),
        timeout=30,
        what=f"the abort's advice acknowledged, saw {advice_of(pg_backend, merchant.id, key)}",
    )
    at_acquirer = store.summary(pg_backend.tmp / "var" / "acquirer.sqlite3")[rrn]
    assert (at_acquirer.requests, at_acquirer.approved, at_acquirer.reversed) == (1, True, True)
    assert rrn not in store.net_approvals(pg_backend.tmp / "var" / "acquirer.sqlite3")


def advice_of(backend: Backend, merchant_id: str, key: str) -> tuple[str, str, bool] | None:
    """(kind, rrn, acknowledged?) of the key's reversal advice, if one was queued."""
    rows = backend.sql(
        "SELECT kind, rrn, acknowledged_at IS NOT NULL FROM acquirer_advice"
        " WHERE merchant_id = :m AND key = :k",
        m=merchant_id,
        k=key,
    )
    return (str(rows[0][0]), str(rows[0][1]), bool(rows[0][2])) if rows else None
