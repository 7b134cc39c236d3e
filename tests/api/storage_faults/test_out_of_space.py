"""What the SQLite writer takes for a full disk (``sqlite_wal.out_of_space``): SQLITE_FULL
itself, and an error raised while undoing a create SQLITE_FULL cut short (SQLite may roll
the whole transaction back, and the savepoint's ROLLBACK TO then fails) — not other
errors."""

from __future__ import annotations

import sqlite3

from api.sqlite_wal import out_of_space


def _full() -> sqlite3.OperationalError:
    error = sqlite3.OperationalError("database or disk is full")
    error.sqlite_errorcode = 13
    return error


def test_sqlite_full_is_out_of_space() -> None:
    assert out_of_space(_full())


def test_an_error_while_undoing_a_full_write_is_out_of_space() -> None:
    try:
        try:
            raise _full()
        except sqlite3.OperationalError:
            raise sqlite3.OperationalError("no such savepoint: one_create") from None
    except sqlite3.OperationalError as undo:
        assert undo.__context__ is not None
        assert out_of_space(undo)


def test_other_errors_are_not() -> None:
    assert not out_of_space(sqlite3.OperationalError("database is locked"))
    assert not out_of_space(sqlite3.IntegrityError("UNIQUE constraint failed"))
    assert not out_of_space(None)
