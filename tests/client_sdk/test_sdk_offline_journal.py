"""The journal's side of store and forward: STORED is entered only through ``store`` (under
the policy's limits, checked and written in one transaction), leaves only for RESOLVED or
REPORTED — never ABORTED — and an older journal file is brought up keeping its entries."""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from fake_idempay import CARD

from client_sdk import (
    AsyncClient,
    InvalidTransitionError,
    Journal,
    JournalState,
    OfflinePolicy,
    Transaction,
)
from client_sdk._offline import advice_body

POLICY = OfflinePolicy(floor_limit=1000, max_stored_count=5, max_stored_amount=3000, max_age_s=60)
NOW = 1_795_000_000.0


def _request(amount: int = 1000, captured: str = "2026-11-18T11:06:30.000Z") -> str:
    body = {"terminal_id": "T", "type": "purchase", "amount": amount, "currency": "BRL",
            "card": CARD, "captured_at": captured, "expires_at": captured}  # fmt: skip
    return json.dumps(body)


def _begin(journal: Journal, key: str, request: str) -> None:
    journal.begin(key, request, deadline=NOW + 60, reverse_late_approval=False)


def test_stored_is_entered_only_through_store_and_never_aborted(journal_path: Path) -> None:
    with Journal(journal_path) as journal:
        _begin(journal, "k1", _request())
        with pytest.raises(InvalidTransitionError, match="store"):
            journal.transition("k1", JournalState.STORED)
        with pytest.raises(InvalidTransitionError, match="REPORTED"):
            journal.transition("k1", JournalState.REPORTED)
        stored = journal.store("k1", advice_body(_request()), policy=POLICY, now=NOW)
        assert not isinstance(stored, str) and stored.state is JournalState.STORED
        assert stored.request["entry_mode"] == "offline" and "expires_at" not in stored.request
        for state in (JournalState.ABORTED, JournalState.IN_DOUBT, JournalState.SENT):
            with pytest.raises(InvalidTransitionError, match="forwarded"):
                journal.transition("k1", state)
        journal.transition("k1", JournalState.STORED, attempts=3)  # a forward attempt
        journal.transition("k1", JournalState.REPORTED, outcome={"kind": "error"})
        assert journal.unresolved() == [] and journal.stored() == []
        with pytest.raises(InvalidTransitionError):
            journal.transition("k1", JournalState.RESOLVED)


def test_a_payment_in_doubt_cannot_be_stored(journal_path: Path) -> None:
    with Journal(journal_path) as journal:
        _begin(journal, "k1", _request())
        journal.transition("k1", JournalState.IN_DOUBT)
        with pytest.raises(InvalidTransitionError, match="cannot be stored"):
            journal.store("k1", advice_body(_request()), policy=POLICY, now=NOW)


def test_racing_stores_never_exceed_a_limit_together(journal_path: Path) -> None:
    """Twelve payments of 1000 race to be stored under a 3000 total: exactly three win."""
    keys = [f"k{i}" for i in range(12)]
    with Journal(journal_path) as journal:
        for key in keys:
            _begin(journal, key, _request())
    results: dict[str, object] = {}
    start = threading.Barrier(len(keys))

    def store(key: str) -> None:
        with Journal(journal_path) as own:  # one connection per thread, as processes would
            start.wait()
            results[key] = own.store(key, advice_body(_request()), policy=POLICY, now=NOW)

    threads = [threading.Thread(target=store, args=(key,)) for key in keys]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert (
        sorted(str(r) for r in results.values() if isinstance(r, str)) == ["max_stored_amount"] * 9
    )
    with Journal(journal_path) as journal:
        exposure = journal.offline_exposure()
    assert (exposure.count, dict(exposure.amounts)) == (3, {"BRL": 3000})


V2_SCHEMA = """
CREATE TABLE journal_entry (
    key TEXT PRIMARY KEY, request TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('PENDING', 'SENT', 'IN_DOUBT', 'RESOLVED', 'ABORTED')),
    attempts INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0), outcome TEXT,
    deadline REAL NOT NULL, reverse_late_approval INTEGER NOT NULL DEFAULT 0,
    created_at TEXT NOT NULL, updated_at TEXT NOT NULL, lease_owner TEXT, lease_until REAL);
CREATE INDEX ix_journal_entry_open ON journal_entry (created_at)
    WHERE state NOT IN ('RESOLVED', 'ABORTED');
INSERT INTO journal_entry VALUES ('k-old', '{}', 'IN_DOUBT', 2, NULL, 1.0, 0,
    '2026-11-18T00:00:00+00:00', '2026-11-18T00:00:00+00:00', '1:a:b', 5.0);
PRAGMA user_version = 2;
"""


def test_a_version_2_journal_is_brought_up_keeping_its_entries_and_lease(
    journal_path: Path, older_journal: Callable[[str], Journal]
) -> None:
    with older_journal(V2_SCHEMA) as journal:
        [entry] = journal.unresolved()
        assert (entry.key, entry.state, entry.attempts) == ("k-old", JournalState.IN_DOUBT, 2)
        _begin(journal, "k-new", _request())
        assert not isinstance(
            journal.store("k-new", advice_body(_request()), policy=POLICY, now=NOW), str
        )
    db = sqlite3.connect(journal_path)
    assert db.execute("PRAGMA user_version").fetchone() == (5,)
    assert db.execute("SELECT lease_owner FROM journal_entry WHERE key = 'k-old'").fetchone() == (
        "1:a:b",
    )
    db.close()


async def test_the_async_client_stores_forwards_and_awaits_its_callbacks(
    fake, make_async_client, journal_path: Path
) -> None:  # type: ignore[no-untyped-def]
    declined: list[Transaction] = []

    async def on_decline(transaction: Transaction) -> None:
        declined.append(transaction)

    fake.down = True
    pos: AsyncClient = make_async_client(offline=POLICY, on_offline_decline=on_decline)
    card = {**CARD, "token": "tok_decline_do_not_honor"}
    sold = await pos.purchase(amount=900, currency="BRL", card=card)
    assert sold.offline and pos.journal.stored()[0].key == sold.id
    fake.down = False
    [forwarded] = await pos.forward()
    assert forwarded.state is JournalState.RESOLVED
    assert [(t.id, t.status, t.offline) for t in declined] == [(sold.id, "declined", True)]
    await pos.close()
