"""The journal's file (issue 24 item 9): deleted or replaced while in use is an error, not
silent writes to an unlinked inode; the schema version is stamped and checked; integrity
is checked at open; a journal written before versions were stamped is upgraded."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
from fake_idempay import CARD, FakeIdempay

from client_sdk import Client, Journal, JournalError, JournalState
from client_sdk._journal import new_owner

MakeClient = Callable[..., Client]
LEGACY_SCHEMA = """
CREATE TABLE journal_entry (
    key TEXT PRIMARY KEY, request TEXT NOT NULL, state TEXT NOT NULL, attempts INTEGER NOT NULL
    DEFAULT 0, outcome TEXT, deadline REAL NOT NULL, reverse_late_approval INTEGER NOT NULL
    DEFAULT 0, created_at TEXT NOT NULL, updated_at TEXT NOT NULL);
INSERT INTO journal_entry VALUES ('k-old', '{}', 'IN_DOUBT', 1, NULL, 100.0, 0,
    '2026-11-20T12:00:00+00:00', '2026-11-20T12:00:00+00:00');
"""


def _remove(path: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def test_a_journal_deleted_while_the_terminal_runs_refuses_the_next_payment(
    make_client: MakeClient, fake: FakeIdempay, journal_path: Path
) -> None:
    client = make_client()
    client.purchase(amount=100, currency="BRL", card=CARD)
    sent = len(fake.wire)
    _remove(journal_path)
    with pytest.raises(JournalError, match="deleted or replaced"):
        client.purchase(amount=200, currency="BRL", card=CARD)
    assert len(fake.wire) == sent  # nothing left the terminal without a durable entry


def test_a_journal_replaced_while_in_use_is_detected(journal_path: Path) -> None:
    journal = Journal(journal_path)
    _remove(journal_path)
    Journal(journal_path).close()  # a new, empty file at the same path
    with pytest.raises(JournalError, match="deleted or replaced"):
        journal.unresolved()
    journal.close()


def test_the_schema_version_is_stamped_and_a_newer_one_refused(journal_path: Path) -> None:
    Journal(journal_path).close()
    db = sqlite3.connect(journal_path)
    assert db.execute("PRAGMA user_version").fetchone() == (5,)
    db.execute("PRAGMA user_version = 99")
    db.commit()
    db.close()
    with pytest.raises(JournalError, match="schema version 99"):
        Journal(journal_path)


def test_a_journal_from_before_versions_is_upgraded_keeping_its_entries(
    older_journal: Callable[[str], Journal],
) -> None:
    with older_journal(LEGACY_SCHEMA) as journal:
        [entry] = journal.unresolved()
        assert (entry.key, entry.state) == ("k-old", JournalState.IN_DOUBT)
        assert journal.claim("k-old", "1:a:b", now=0.0, hold_s=1.0) == entry


def test_a_file_that_is_not_a_sound_journal_is_refused_at_open(journal_path: Path) -> None:
    journal_path.write_bytes(b"SQLite format 3\x00" + os.urandom(4096))
    with pytest.raises(JournalError):
        Journal(journal_path)


def test_a_lease_is_refused_while_its_live_holder_runs_and_taken_once_it_is_gone(
    journal_path: Path,
) -> None:
    with Journal(journal_path) as journal:
        mine, other = new_owner(), new_owner()
        journal.begin("k", "{}", deadline=100.0, reverse_late_approval=False, owner=mine,
                      lease_until=200.0)  # fmt: skip
        assert journal.claim("k", other, now=150.0, hold_s=10.0) is None  # held, alive
        assert journal.claim("k", other, now=250.0, hold_s=10.0) is not None  # expired
        journal.release("k", other)
        dead = "999999999:0000000000000000:x"  # no such process
        journal.claim("k", dead, now=250.0, hold_s=1000.0)
        assert journal.claim("k", mine, now=260.0, hold_s=10.0) is not None
