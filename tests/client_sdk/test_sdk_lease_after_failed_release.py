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

from client_sdk import Journal, JournalEntry, JournalError
from client_sdk._journal import new_owner, owner_alive


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


def test_a_cancelled_drive_leaves_its_key_to_recover_in_the_same_process(
    tmp_path: Path,
) -> None:
    """A purchase cancelled mid-send (asyncio.wait_for) ran no Release: its lease stayed
    'alive' in this process and recover() skipped the payment until the lease ran out."""
    import asyncio

    import httpx

    from client_sdk import AsyncClient

    async def slow(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/healthz":
            return httpx.Response(200, json={"status": "ok"})
        await asyncio.sleep(5)
        return httpx.Response(500)

    async def scenario() -> JournalEntry | None:
        transport = httpx.MockTransport(slow)
        pos = AsyncClient(
            "http://idempay.test",
            "idp_test",
            terminal_id="T-1",
            journal=tmp_path / "pos.db",
            transport=transport,
        )
        with pytest.raises(TimeoutError):
            card = {"token": "tok_visa_4242", "last4": "4242", "brand": "visa"}
            await asyncio.wait_for(pos.purchase(amount=100, currency="BRL", card=card), 0.3)
        [left] = pos.journal.unresolved()
        taken = pos.journal.claim(left.key, new_owner(), now=time.time(), hold_s=30)
        await pos.close()
        return taken

    assert asyncio.run(scenario()) is not None


def test_a_drive_counts_as_running_from_before_its_lease_is_written(tmp_path: Path) -> None:
    """begin() wrote the lease, then registered its drive: a claim in between took a
    running drive's key (two drivers)."""
    journal = Journal(tmp_path / "pos.db")
    seen: list[bool] = []
    real = journal._db

    class Spy:
        def execute(self, sql: str, *args: Any) -> Any:
            result = real.execute(sql, *args)
            if sql.startswith("INSERT INTO journal_entry"):
                seen.append(owner_alive(args[0][-2]))  # the lease as a claim would see it
            return result

        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

    journal._db = Spy()  # type: ignore[assignment]
    journal.begin("k2", "{}", deadline=time.time() + 60, reverse_late_approval=False,
                  owner=new_owner(), lease_until=time.time() + 60)  # fmt: skip
    journal._db = real
    journal.close()
    assert seen == [True]
