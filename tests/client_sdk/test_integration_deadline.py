"""A payment deadline shorter than the issuer's latency ends in abort, against the real
server on Postgres; the original request, held by the chaos proxy and released after the
abort, is refused with 410 and never charged.

Timeline (server: issuer takes 12 s, gives up waiting after 1.5 s; SDK: 1 s per request,
deadline 2.5 s): the original create is held in the network → the terminal times out,
looks up (404) and resends with the same key → the server claims it and waits on the slow
issuer → the terminal times out again, looks up (202) → deadline → abort (409 while the
server works, then the fence) → ``PaymentAbortedError``. Then the original arrives: 410.

The server has a database of its own, and its issuer is far slower than the deadline
(12 s vs 2.5 s): the test once failed because another module's server, sharing the session
database, re-drove this key from its completer with a 0.8 s issuer and approved it before
the abort — right for that server, wrong for this test's premise.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from integration_db import Merchant, journal_entries, wait_for

from api.config import Settings
from api.transactions.issuer import derive_issuer_key
from client_sdk import Client, JournalState, PaymentAbortedError, RetryPolicy
from idempay_tools.chaos_proxy import ChaosProxy, ProxyThread
from tests.support.backend import Backend
from tests.support.services import Server

ISSUER_SLOW_S = 12.0
DEADLINE_S = 2.5
HOLD_ORIGINAL_S = 16.0
SLOW_CARD = {"token": "tok_issuer_slow", "last4": "0002", "brand": "visa"}


@pytest.fixture
def slow_issuer_server(private_pg_backend: Backend) -> Iterator[Server]:
    # A database of its own: another module's server (issuer 0.8 s) once re-drove this
    # key from its completer and approved it before the abort.
    server = private_pg_backend.server(IDEMPAY_ISSUER_SLOW_SECONDS=str(ISSUER_SLOW_S))
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
    issuer_key = derive_issuer_key(Settings().secret_key, merchant.id, key)
    [(result,)] = pg_backend.sql(
        "SELECT result FROM issuer_authorization WHERE issuer_key = :k", k=issuer_key
    )
    assert result == "voided"
