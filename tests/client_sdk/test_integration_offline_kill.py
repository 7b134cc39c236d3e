"""A terminal that sold offline is SIGKILLed, then reboots: the stored payment is forwarded
exactly once, on Postgres and on SQLite (issue 16).

- ``stored``: killed after the journal holds the sale STORED and before anything was
  forwarded; ``recover()`` in a new process forwards it — once: a second ``recover()`` has
  nothing left to do.
- ``forwarding``: the rebooted terminal is killed again while its advice is held in the
  network (the chaos proxy); a third process forwards it with the same key, and the held
  copy, released late, is answered with the replay — one transaction, one charge.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from integration_db import Merchant, journal_entries, wait_for
from integration_terminal import killed, recovered, terminal

from client_sdk import JournalEntry, JournalState
from idempay_tools.chaos_proxy import ChaosProxy, ProxyThread
from idempay_tools.serve_process import free_port
from tests.support.backend import Backend
from tests.support.services import Server

HOLD_S = 8.0


def stored(journal: Path) -> JournalEntry | None:
    if not journal.exists():
        return None
    entries = journal_entries(journal)
    return entries[0] if entries and entries[0].state is JournalState.STORED else None


def sell_offline_and_kill(merchant: Merchant, journal: Path) -> JournalEntry:
    dead = f"http://127.0.0.1:{free_port()}"  # nobody listens: every connection is refused
    paying = terminal("pay-offline", dead, merchant.api_key, str(journal))
    try:
        assert paying.stdout is not None
        line = json.loads(paying.stdout.readline())
        entry = wait_for(lambda: stored(journal), timeout=30, what="the stored sale")
        assert line == {"key": entry.key, "status": "approved", "offline": True}
        assert paying.poll() is None, "the terminal ended before the kill"
    finally:
        killed(paying)
    assert merchant.key_states() == {}
    return entry


@pytest.mark.parametrize("window", ["stored", "forwarding"])
def test_a_sale_stored_offline_survives_a_kill_and_is_forwarded_once(
    backend: Backend, server: Server, tmp_path: Path, window: str
) -> None:
    merchant = Merchant.create(backend, f"offline-kill-{window}-{uuid.uuid4().hex[:8]}")
    journal = tmp_path / "pos.db"
    entry = sell_offline_and_kill(merchant, journal)
    key = entry.key
    proxy: ProxyThread | None = None
    if window == "forwarding":
        proxy = ChaosProxy(target_host="127.0.0.1", target_port=server.port).run_in_thread()
        proxy.hold_next(seconds=HOLD_S, match="POST /v1/transactions ")
        rebooted = terminal("recover", f"http://127.0.0.1:{proxy.port}", merchant.api_key,
                            str(journal))  # fmt: skip
        try:
            wait_for(lambda: proxy.stats["hold"] == 1, timeout=30, what="the held advice")
        finally:
            killed(rebooted)
        assert stored(journal) is not None  # killed mid-forward: still owed
    try:
        lines = recovered(server.url, merchant.api_key, journal)
        assert lines == [{"key": key, "state": "RESOLVED", "status": "approved"}]
        assert recovered(server.url, merchant.api_key, journal) == []  # exactly once
        if proxy is not None:
            wait_for(lambda: proxy.released, timeout=HOLD_S + 10, what="the held advice")
            assert [r.status for r in proxy.released] == [201]  # the replay
    finally:
        if proxy is not None:
            proxy.stop()
    [final] = journal_entries(journal)
    assert final.state is JournalState.RESOLVED and final.outcome is not None
    assert final.outcome["body"]["offline"] is True
    assert merchant.transactions() == {key: "approved"}
    assert merchant.charges() == {key: 1}
    expected = ["created"] if window == "stored" else ["created", "replayed"]
    wait_for(
        lambda: [e[0] for e in merchant.create_events(key)] == expected,
        timeout=10,
        what=f"create events {expected}, saw {merchant.create_events(key)}",
    )
