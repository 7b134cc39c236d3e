"""A terminal process SIGKILLed mid-payment, then ``recover()`` in a new process on the same
journal, against the real server on Postgres. The kill lands deterministically in one of
three windows:

- ``before_send``: the journal entry is written (SENT) but the fault transport holds the
  request before it leaves — the server never heard of the key;
- ``after_send``: the request left and the chaos proxy holds it — the server has not
  processed it yet, and the original is released late, after recovery;
- ``after_commit``: the server processed it, the proxy dropped the answer, and the
  terminal's lookup is held — the journal says IN_DOUBT.

Every case ends with one definitive journal entry and at most one charge. ``recover()``
never sells (issue 24 item 4): in the first two windows the server does not know the key,
so recovery fences it with abort — the entry ends ABORTED, nothing is charged, and the
original released late is refused with 410. Only a payment the server processed is
settled as approved.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from integration_db import Merchant, journal_entries, wait_for
from integration_terminal import killed, recovered, terminal

from client_sdk import JournalEntry, JournalState
from idempay_tools.chaos_proxy import ProxyThread
from tests.support.backend import Backend

HOLD_ORIGINAL_S = 10.0
WINDOWS = ["before_send", "after_send", "after_commit"]


def only_entry(journal: Path) -> JournalEntry | None:
    if not journal.exists():
        return None
    entries = journal_entries(journal)
    assert len(entries) <= 1
    return entries[0] if entries else None


def in_state(journal: Path, state: JournalState) -> JournalEntry | None:
    entry = only_entry(journal)
    return entry if entry is not None and entry.state is state else None


def arm(window: str, proxy: ProxyThread) -> list[str]:
    """Set the trap for ``window``; the extra arguments for the paying process."""
    if window == "before_send":
        return ["--gate"]
    if window == "after_send":
        proxy.hold_next(seconds=HOLD_ORIGINAL_S, match="POST /v1/transactions ")
    else:
        proxy.inject("drop_response", match="POST /v1/transactions ")
        proxy.hold_next(seconds=60.0, match="GET /v1/transactions/")
    return []


def reached(window: str, journal: Path, proxy: ProxyThread, merchant: Merchant) -> bool:
    if window == "before_send":
        return in_state(journal, JournalState.SENT) is not None
    if window == "after_send":
        return proxy.stats["hold"] == 1 and in_state(journal, JournalState.SENT) is not None
    entry = in_state(journal, JournalState.IN_DOUBT)
    return proxy.stats["hold"] == 1 and entry is not None and entry.key in merchant.transactions()


@pytest.mark.parametrize("window", WINDOWS)
def test_a_terminal_killed_mid_payment_is_settled_by_recover_in_a_new_process(
    pg_backend: Backend, proxy: ProxyThread, tmp_path: Path, window: str
) -> None:
    merchant = Merchant.create(pg_backend, f"kill-{window}-{uuid.uuid4().hex[:8]}")
    url = f"http://127.0.0.1:{proxy.port}"
    journal = tmp_path / "pos.db"
    paying = terminal("pay", url, merchant.api_key, str(journal), *arm(window, proxy))
    try:
        wait_for(lambda: reached(window, journal, proxy, merchant), timeout=30, what=window)
        assert paying.poll() is None, "the payment finished before the kill"
    finally:
        killed(paying)
    entry = only_entry(journal)
    assert entry is not None and not entry.state.is_terminal
    key = entry.key
    if window == "after_commit":
        assert merchant.transactions() == {key: "approved"}
    else:
        assert key not in merchant.key_states()  # nothing processed (or even seen) yet

    [line] = recovered(url, merchant.api_key, journal)
    [final] = journal_entries(journal)
    assert final.state.is_terminal and final.outcome is not None
    if window == "after_commit":
        assert line == {"key": key, "state": "RESOLVED", "status": "approved"}
        assert final.outcome["status"] == "approved"
        assert merchant.transactions() == {key: "approved"}
    else:  # never sold at boot: fenced
        assert line == {"key": key, "state": "ABORTED", "status": None}
        assert final.state is JournalState.ABORTED
        assert merchant.key_states() == {key: "aborted"}
        assert merchant.transactions() == {}
    expected = {
        "before_send": [],  # the payment never left the terminal, and never will
        "after_send": [("aborted", 410, 1)],  # the late original hits the fence
        "after_commit": [("created", 201, 1)],  # recovery only looked it up
    }[window]
    if window == "after_send":
        assert proxy.released == [], "the held original must still be in the network"
        wait_for(lambda: proxy.released, timeout=HOLD_ORIGINAL_S + 10, what="the original")
        assert [r.status for r in proxy.released] == [410]
    wait_for(
        lambda: merchant.create_events(key) == expected,
        timeout=10,
        what=f"create events {expected}, saw {merchant.create_events(key)}",
    )
    assert merchant.charges() == ({key: 1} if window == "after_commit" else {})
    assert merchant.aborted_with_transaction() == []
