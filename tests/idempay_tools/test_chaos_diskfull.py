"""``make chaos``'s SQLite disk-full episode (idempay_tools/_chaos_diskfull.py): its checks
catch an untruthful answer, its disk never outlives it, and ``Beside`` hands its failures to
the run. The episode end to end: tests/api/storage_faults/test_disk_full.py."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import uuid
from pathlib import Path

import pytest

from api.config import Settings
from api.migrate import migrate
from idempay_tools import _chaos_diskfull as episode
from idempay_tools._chaos_diskfull import Answer, DiskFull, Load, LoopDisk


def _database(tmp_path: Path, written: str) -> Path:
    """A migrated SQLite database holding one completed create under ``written``."""
    path = tmp_path / "idempay.db"
    migrate(Settings(database_url=f"sqlite+aiosqlite:///{path}", var_dir=tmp_path))
    db = sqlite3.connect(path)
    now = "2026-11-28 10:00:00.000000"
    db.execute(
        "INSERT INTO idempotency_key (merchant_id, key, state, fingerprint, lease_token,"
        " response_status, created_at, updated_at) VALUES ('m', ?, 'completed', 'f', 1, 201, ?, ?)",
        (written, now, now),
    )
    db.execute(
        'INSERT INTO "transaction" (merchant_id, id, terminal_id, type, amount, currency,'
        " card_last4, card_brand, card_fingerprint, installments, status, created_at,"
        " processed_at, offline) VALUES ('m', ?, 'T', 'purchase', 1, 'BRL', '4242', 'visa',"
        " 'fp', 1, 'approved', ?, ?, 0)",
        (written, now, now),
    )
    db.commit()
    db.close()
    return path


def _load(*answers: tuple[str, int | None]) -> Load:
    load = Load("http://127.0.0.1:9", "key")
    load.answers = [Answer(key, 0.0, status) for key, status in answers]
    return load


def test_the_checks_pass_truthful_answers(tmp_path: Path) -> None:
    written, refused = str(uuid.uuid4()), str(uuid.uuid4())
    result = DiskFull()
    episode._check(_database(tmp_path, written), _load((written, 201), (refused, 503)), result)
    assert result.errors == []


def test_the_checks_catch_a_201_not_written_and_a_503_written(tmp_path: Path) -> None:
    written, missing = str(uuid.uuid4()), str(uuid.uuid4())
    database = _database(tmp_path, written)
    result = DiskFull()
    episode._check(database, _load((missing, 201), (written, 503), (written, 500)), result)
    assert any("answered 201 are not written" in e for e in result.errors)
    assert any("answered 503 were written" in e for e in result.errors)
    assert any("answers other than" in e for e in result.errors)


def test_the_checks_catch_a_wal_past_its_ceiling(tmp_path: Path) -> None:
    written = str(uuid.uuid4())
    result = DiskFull(wal_max_bytes=episode.WAL_CEILING_BYTES + 1)
    episode._check(_database(tmp_path, written), _load((written, 201)), result)
    assert any("the WAL grew" in e for e in result.errors)


def test_without_root_the_episode_fails_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    errors: list[str] = []
    result = episode.Beside(tmp_path, errors).finish(30.0)
    assert result is not None and not result.ok
    assert errors == ["sqlite disk full: the SQLite disk-full episode needs root (a loop mount)"]


@pytest.mark.skipif(os.geteuid() != 0, reason="a loop mount needs root")
def test_the_loop_disk_is_unmounted_and_removed_whatever_happens(tmp_path: Path) -> None:
    disk = LoopDisk(tmp_path / "disk", mib=16)
    with pytest.raises(RuntimeError), disk:
        filler = disk.fill()
        assert disk.free_bytes() < 1024 * 1024 and filler.stat().st_size > 0
        raise RuntimeError("the episode failed half-way")
    assert str(disk.mount) not in subprocess.run(["mount"], capture_output=True, text=True).stdout
    assert not disk.image.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="a loop mount needs root")
def test_the_sweep_unmounts_a_disk_left_in_the_run_folder_and_the_filler_stops(
    tmp_path: Path,
) -> None:
    """A run interrupted mid-episode (SIGTERM, or the harness SIGKILLed and the reaper
    cleaning up) left the loop disk mounted in its folder, which could then not be
    removed. The sweep unmounts it; a filler still running never fills what is under it."""
    from idempay_tools._chaos_reaper import mounts_under, sweep

    disk = LoopDisk(tmp_path / "disk", mib=16)
    with disk:
        assert mounts_under(tmp_path) == [disk.mount]
        assert f"mount {disk.mount}" in sweep(tmp_path, grace_s=0.1)
        assert mounts_under(tmp_path) == []
        with pytest.raises(RuntimeError, match="not mounted"):
            disk.fill()
        assert not (disk.mount / "filler").exists()
    mounted = subprocess.run(["mount"], capture_output=True, text=True).stdout
    assert str(disk.mount) not in mounted
