"""A drive that ends without giving its lease back — the release's own journal write failed
(disk full) — must not keep recover() in the same process off the key until the lease runs
out. make chaos found it: after a journal disk-full flap one entry stayed in doubt because
the terminal's final recover() saw its own dead drive's lease as a live driver."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from client_sdk import Journal, JournalError
from client_sdk._journal import new_owner


class _FullDisk:
    """A connection whose writes fail like a full disk (reads pass)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def execute(self, sql: str, *args: Any) -> Any:
        if sql.lstrip().upper().startswith("UPDATE"):
            raise sqlite3.OperationalError("database or disk is full")
        return self._db.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)


def test_a_lease_whose_release_failed_is_free_for_the_same_process(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "pos.db")
    now = time.time()
    driver, recoverer = new_owner(), new_owner()
    journal.begin("k1", "{}", deadline=now + 60, reverse_late_approval=False,
                  owner=driver, lease_until=now + 3_600)  # fmt: skip
    assert journal.claim("k1", recoverer, now=now, hold_s=30) is None  # the drive runs
    real = journal._db
    journal._db = _FullDisk(real)  # type: ignore[assignment]
    with pytest.raises(JournalError):
        journal.release("k1", driver)  # the drive ends; its lease stays written
    journal._db = real
    taken = journal.claim("k1", recoverer, now=now, hold_s=30)
    assert taken is not None and taken.key == "k1"
    journal.close()
