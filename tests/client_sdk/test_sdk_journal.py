"""The durable journal (client_sdk/_journal.py): states, finality, durability."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from client_sdk import InvalidTransitionError, Journal, JournalError, JournalState

S = JournalState
TERMINAL = [S.RESOLVED, S.ABORTED]


def _begin(journal: Journal, key: str = "k1") -> None:
    journal.begin(key, '{"amount": 1}', deadline=100.0, reverse_late_approval=True)


def test_a_new_entry_is_pending_and_committed_for_any_other_reader(tmp_path: Path) -> None:
    path = tmp_path / "pos.db"
    with Journal(path) as journal:
        entry = journal.begin("k1", '{"amount": 1}', deadline=100.0, reverse_late_approval=True)
        assert (entry.state, entry.attempts, entry.outcome) == (S.PENDING, 0, None)
        other = sqlite3.connect(path)
        rows = other.execute("SELECT key, state, request FROM journal_entry").fetchall()
        other.close()
    assert rows == [("k1", "PENDING", '{"amount": 1}')]


def test_the_happy_path_walks_every_state_and_survives_a_reopen(tmp_path: Path) -> None:
    path = tmp_path / "pos.db"
    with Journal(path) as journal:
        _begin(journal)
        journal.transition("k1", S.SENT, attempts=1)
        journal.transition("k1", S.IN_DOUBT)
        journal.transition("k1", S.SENT, attempts=2)
        journal.transition("k1", S.RESOLVED, outcome={"kind": "transaction"})
    with Journal(path) as reopened:
        entry = reopened.get("k1")
    assert entry is not None
    assert (entry.state, entry.attempts, entry.outcome) == (S.RESOLVED, 2, {"kind": "transaction"})
    assert entry.request == {"amount": 1}
    assert entry.deadline == 100.0
    assert entry.reverse_late_approval is True
    assert entry.updated_at >= entry.created_at
    assert entry.created_at.tzinfo is not None


@pytest.mark.parametrize("final", TERMINAL)
@pytest.mark.parametrize("target", list(S))
def test_terminal_states_are_final(tmp_path: Path, final: S, target: S) -> None:
    with Journal(tmp_path / "pos.db") as journal:
        _begin(journal)
        journal.transition("k1", final, outcome={"kind": "x"})
        with pytest.raises(InvalidTransitionError):
            journal.transition("k1", target)
        entry = journal.get("k1")
    assert entry is not None and entry.state is final


def test_no_entry_goes_back_to_pending_and_attempts_never_decrease(tmp_path: Path) -> None:
    with Journal(tmp_path / "pos.db") as journal:
        _begin(journal)
        with pytest.raises(InvalidTransitionError):
            journal.transition("k1", S.PENDING)
        journal.transition("k1", S.SENT, attempts=3)
        with pytest.raises(InvalidTransitionError):
            journal.transition("k1", S.SENT, attempts=2)
        entry = journal.get("k1")
    assert entry is not None and (entry.state, entry.attempts) == (S.SENT, 3)


def test_keys_are_unique_and_unknown_keys_refused(tmp_path: Path) -> None:
    with Journal(tmp_path / "pos.db") as journal:
        _begin(journal)
        with pytest.raises(JournalError):
            _begin(journal)
        with pytest.raises(JournalError):
            journal.transition("nope", S.SENT)


def test_unresolved_lists_only_open_entries_oldest_first(tmp_path: Path) -> None:
    with Journal(tmp_path / "pos.db") as journal:
        for key in ("a", "b", "c", "d"):
            _begin(journal, key)
        journal.transition("b", S.RESOLVED)
        journal.transition("c", S.ABORTED)
        journal.transition("d", S.IN_DOUBT)
        assert [e.key for e in journal.unresolved()] == ["a", "d"]
        assert [e.key for e in journal.entries()] == ["a", "b", "c", "d"]


def test_the_file_is_wal_with_full_synchronous_commits(tmp_path: Path) -> None:
    with Journal(tmp_path / "pos.db") as journal:
        db = journal._db
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert db.execute("PRAGMA synchronous").fetchone() == (2,)  # FULL


def test_concurrent_writers_from_threads_lose_nothing(tmp_path: Path) -> None:
    with Journal(tmp_path / "pos.db") as journal:

        def work(n: int) -> None:
            for i in range(20):
                key = f"{n}-{i}"
                _begin(journal, key)
                journal.transition(key, S.SENT, attempts=1)
                journal.transition(key, S.RESOLVED)

        threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        entries = journal.entries()
    assert len(entries) == 80
    assert {e.state for e in entries} == {S.RESOLVED}
