"""On a filling SQLite disk, new keys are refused before anything else (``WalKeeper``,
api/sqlite_wal.py; docs/operations.md, "The embedded SQLite"): a key already
claimed has its 0200 out, and its finish — or its in-doubt settlement — must still fit, so an
approved sale is recorded rather than settled declined for want of space. Found with a real
server on a nearly full loop disk: claims written, their finishes refused, answered 202 and
settled declined / acquirer_timeout with a reversal."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import text

from api import sqlite_wal
from api.config import Settings
from api.db import atomic, create_engine
from api.sqlite_wal import NEW_KEY_HEADROOM_BYTES, WRITE_HEADROOM_BYTES, WalKeeper


def _keeper_with_room(tmp_path: Path, room: int) -> WalKeeper:
    keeper = WalKeeper(str(tmp_path / "db.sqlite3"))
    keeper.room = lambda: room  # type: ignore[method-assign]
    keeper.wal_bytes = lambda: 0  # type: ignore[method-assign]
    return keeper


def _no_sql(sql: str) -> tuple[int, int, int] | None:
    """The keeper's checkpoint statements, answered as SQLite would on an empty WAL."""
    return (0, 0, 0) if "wal_checkpoint" in sql else None


def test_a_new_key_needs_more_room_than_a_finish(tmp_path: Path) -> None:
    # a finish fits (the WAL plus its headroom), a new key does not (plus its own)
    room = WRITE_HEADROOM_BYTES + NEW_KEY_HEADROOM_BYTES // 2
    keeper = _keeper_with_room(tmp_path, room)
    assert keeper.before_write(_no_sql) is None  # a finish, a settlement, events
    refused = keeper.before_write(_no_sql, new_key=True)
    assert refused is not None and "no new key" in refused
    plenty = _keeper_with_room(tmp_path, 4 * (WRITE_HEADROOM_BYTES + NEW_KEY_HEADROOM_BYTES))
    assert plenty.before_write(_no_sql, new_key=True) is None


async def test_the_claim_transaction_is_the_one_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the engine: ``atomic(new_key=True)`` (the claim) fails as a failed BEGIN would
    (a 503, nothing written); a plain ``atomic`` (a finish) on the same disk goes through."""
    path = tmp_path / "db.sqlite3"
    sqlite3.connect(path).close()
    room = WRITE_HEADROOM_BYTES + NEW_KEY_HEADROOM_BYTES // 2
    monkeypatch.setattr(WalKeeper, "room", lambda self: room)
    monkeypatch.setattr(WalKeeper, "wal_bytes", lambda self: 0)
    monkeypatch.setattr(sqlite_wal, "_KEEPERS", {})
    engine = create_engine(Settings(database_url=f"sqlite+aiosqlite:///{path}"))
    try:
        async with atomic(engine) as conn:
            await conn.execute(text("CREATE TABLE t (x INTEGER)"))
        with pytest.raises(Exception, match="no new key"):
            async with atomic(engine, new_key=True) as conn:
                await conn.execute(text("INSERT INTO t VALUES (1)"))
        async with atomic(engine) as conn:
            await conn.execute(text("INSERT INTO t VALUES (2)"))
        async with engine.connect() as conn:
            rows = (await conn.execute(text("SELECT x FROM t"))).scalars().all()
        assert rows == [2]
    finally:
        await engine.dispose()
