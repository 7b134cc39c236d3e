"""A full disk under the embedded SQLite is recovered from with no operator and no restart
(api/sqlite_wal.py, ``WalKeeper``; docs/operations.md, "SQLite").

On a 48 MiB loop-mounted ext4 disk (unmounted and removed whatever happens), ``idempay
serve`` takes creates without a pause while a runaway filler takes every free byte, again
and again, until every create is refused (503) — a key created before is still replayed
and looked up meanwhile; then 4 MiB are freed and nothing else is
done: at least 300 creates must be written after that (the freed space goes to the
database; before, the WAL took it and the server stayed 503); once the filler is gone the
reserve file is laid down again. Every answer stays truthful meanwhile: each create
answered 201 is in the database, each answered 503 left nothing, nothing else is answered,
``integrity_check`` is ok, and the WAL never passes its ceiling. The episode itself is
``idempay_tools._chaos_diskfull`` (``make chaos`` runs it too)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from idempay_tools._chaos_diskfull import DISK_MIB, WAL_CEILING_BYTES, disk_full_episode

pytestmark = [
    pytest.mark.server,
    pytest.mark.skipif(os.geteuid() != 0, reason="a loop mount needs root"),
]


def _mounted(path: Path) -> bool:
    return str(path) in subprocess.run(["mount"], capture_output=True, text=True).stdout


def test_creates_recover_from_a_full_disk_by_themselves(tmp_path: Path) -> None:
    result = disk_full_episode(tmp_path / "episode")
    assert result.errors == []
    counts = result.counts
    assert counts.get("503", 0) > 0  # the disk was full: creates were refused
    assert set(counts) <= {"201", "202", "503", "None"}
    assert result.full_s is not None and result.recover_s is not None
    assert result.written_after_free >= 300
    assert result.reserve_back
    assert result.replayed_while_full
    assert 0 < result.wal_max_bytes <= WAL_CEILING_BYTES
    assert not _mounted(tmp_path / "episode" / "disk" / "mnt")  # cleaned up
    assert not (tmp_path / "episode" / "disk" / "disk.img").exists()
    assert DISK_MIB == 48
