"""A full disk is recovered from by itself even when the server has no reserve file yet.

The reserve next to the SQLite database (docs/operations.md, "The embedded SQLite") is laid
down only once the disk has 16 MiB free. A server started on a disk with less (the moment an
operator is most likely to restart it: the disk nearly full) has none. The promise does not
depend on it — "while no checkpoint can finish, every write is refused before it begins ... so
the WAL does not take the space a checkpoint needs; once space is freed, creates are written
again by themselves" — so the episode of ``tests/api/storage_faults/test_disk_full.py`` must
end the same way: a 48 MiB loop disk with 12 MiB free when ``idempay serve`` starts, eight
clients creating, a filler taking every free byte until every create is 503, then 4 MiB freed
and nothing else done: at least 300 creates written after that.

What failed before: 22–35 creates were written after the 4 MiB were freed, then 503 with
0 bytes free for good — the WAL took the freed space (3.9 MiB of WAL beside a 0.5 MiB
database): it was restarted only past its fixed 4 MiB bound, more than the disk had, and the
request events queued while creates were refused went in as flushes of 500 (about 1.2 MB of
WAL each); the checkpoint could then not grow the database file and, with no reserve to
give it, never finished. The WAL is now bounded by the room on the disk as well, truncated
(its blocks given back) on a disk short of room, and a write is refused before it begins
while there is not room for its checkpoint (``WalKeeper``).

The simulated acquirer host's store (``<IDEMPAY_VAR_DIR>/acquirer.sqlite3``: a stand-in
for the acquirer, for development and tests, SPEC §6) is kept off the small disk, as in
``test_disk_full.py``'s episode: its own WAL grows by about 25 KB a create up to SQLite's
default 4 MiB, so on the disk it would take most of the 4 MiB freed, and this test is
about idempay's database."""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

import pytest

from idempay_tools._chaos_diskfull import ENV, Load, LoopDisk, _prepare
from idempay_tools.serve_process import ServerProcess
from tests.support.services import ROOT

pytestmark = [
    pytest.mark.server,
    pytest.mark.skipif(os.geteuid() != 0, reason="a loop mount needs root"),
]

FREE_AT_START_MIB = 12  # under the 16 MiB the reserve needs: none is laid down
WRITTEN_AFTER_FREE = 300  # as the episode with a reserve demands


def test_creates_recover_from_a_full_disk_when_no_reserve_was_laid_down(tmp_path: Path) -> None:
    with LoopDisk(tmp_path / "disk", 48) as disk:
        data = disk.mount / "data"
        data.mkdir()
        database = data / "idempay.db"
        env = {
            **ENV,
            "IDEMPAY_DATABASE_URL": f"sqlite+aiosqlite:///{database}",
            "IDEMPAY_VAR_DIR": str(tmp_path / "var"),  # off the disk
        }
        api_key = _prepare(env)
        disk.leave_free(FREE_AT_START_MIB)
        server = ServerProcess(env, tmp_path / "server.log", cwd=ROOT).start()
        load = Load(server.url, api_key, clients=8, wal=Path(f"{database}-wal"))
        try:
            time.sleep(2)
            assert not Path(f"{database}-reserve").exists()  # the premise: no reserve
            load.start()
            began = time.monotonic()
            while time.monotonic() - began < 60:  # a runaway filler until creates are refused
                filler = disk.fill("filler")
                refused = load.first(503, began)
                settled = refused is not None and time.monotonic() - refused.sent > 3
                if settled and load.written_since(time.monotonic() - 2) == 0:
                    break
                time.sleep(0.2)
            assert load.first(503, began) is not None, "the disk never filled"
            LoopDisk.free(filler, 4)
            freed = time.monotonic()
            while time.monotonic() - freed < 60 and load.written_since(freed) < WRITTEN_AFTER_FREE:
                time.sleep(0.5)
            written = load.written_since(freed)
            free_now = disk.free_bytes()
        finally:
            load.stop()
            server.stop()
        connection = sqlite3.connect(database)
        try:
            assert connection.execute("PRAGMA integrity_check").fetchone() == ("ok",)
            stored = {row[0] for row in connection.execute("SELECT key FROM idempotency_key")}
        finally:
            connection.close()
        answers = list(load.answers)
        assert all(a.key in stored for a in answers if a.status == 201)
        assert not any(a.key in stored for a in answers if a.status == 503)
        assert written >= WRITTEN_AFTER_FREE, (
            f"{written} creates written in the 60 s after 4 MiB were freed, then 503 with "
            f"{free_now} bytes free: the freed space went to the WAL, not the checkpoint"
        )
