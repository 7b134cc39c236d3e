"""Migrations: several replicas starting at once (each `idempay serve` migrates) must not
trip over each other on Postgres — one migrates, the others wait and find it done."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from api.migrate import MIGRATION_LOCK
from tests.support.eventually import eventually
from tests.support.services import ROOT, create_database, drop_database, pg_url

# `idempay migrate` processes (eight at once) on throw-away databases: a kind the fast lane
# leaves out, marked here as tests/conftest.py finds none of its fixtures in this module.
pytestmark = pytest.mark.server

# Each process imports everything first, then waits for the go file, so that the
# migrations really start together (imports alone would stagger them by seconds).
RACER = """
import os, sys, time
from api.config import Settings
from api.migrate import migrate
settings = Settings()
print("ready", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.001)
migrate(settings)
"""


def test_concurrent_migrations_on_a_fresh_database_all_succeed(tmp_path: Path) -> None:
    name = create_database("idempay_mig")
    go = tmp_path / "go"
    try:
        env = {**os.environ, "IDEMPAY_DATABASE_URL": pg_url(name)}
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", RACER, str(go)],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
            for _ in range(8)
        ]
        for proc in procs:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == b"ready"
        go.touch()  # every racer is at its start line
        outputs = [proc.communicate(timeout=120)[0].decode() for proc in procs]
        assert [proc.returncode for proc in procs] == [0] * len(procs), outputs
        check = subprocess.run(
            ["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", name, "-tAc",
             "SELECT count(*) FROM alembic_version; SELECT count(*) FROM idempotency_key"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        assert check.stdout.split() == ["1", "0"]
    finally:
        drop_database(name)


def _psql(database: str, sql: str) -> str:
    done = subprocess.run(
        ["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", database, "-tAc", sql],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return done.stdout.strip()


def test_a_migration_waits_for_the_migration_lock(tmp_path: Path) -> None:
    """Deterministic: while another session holds the lock, a migration waits on it (seen in
    pg_stat_activity) and has created nothing; once the holder is gone it completes."""
    name = create_database("idempay_mig")
    holder = subprocess.Popen(
        ["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", name, "-tAc",
         f"SELECT pg_advisory_lock({MIGRATION_LOCK}); SELECT pg_sleep(120)"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    migration: subprocess.Popen[bytes] | None = None
    try:
        held = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
        eventually(
            lambda: _psql(name, held),
            until=lambda count: count == "1",
            what="the test's session to take the migration lock",
            timeout=60,
        )
        migration = subprocess.Popen(
            [sys.executable, "-m", "api", "migrate"],
            cwd=ROOT,
            env={**os.environ, "IDEMPAY_DATABASE_URL": pg_url(name)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        waiting = (
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND wait_event = 'advisory'"
        )
        eventually(
            lambda: _psql(name, waiting),
            until=lambda count: count == "1",
            what="the migration to wait on the lock",
            timeout=60,
        )
        assert migration.poll() is None
        assert _psql(name, "SELECT to_regclass('idempotency_key') IS NULL") == "t"
        _psql(
            name,
            "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' "
            "AND granted",
        )
        output = migration.communicate(timeout=120)[0].decode()
        assert migration.returncode == 0, output
        assert _psql(name, "SELECT count(*) FROM alembic_version") == "1"
    finally:
        holder.kill()
        holder.wait()
        if migration is not None and migration.poll() is None:
            migration.kill()
            migration.wait()
        drop_database(name)


def test_migrate_writes_an_epoch_that_only_new_epoch_renews(tmp_path: Path) -> None:
    """contract §3.6: the epoch Redis entries are bound to is written at `idempay migrate`,
    kept by every later migrate (a restart must not retire the cache), and renewed by
    `idempay admin new-epoch` (after a restore)."""
    name = create_database("idempay_mig")
    env = {**os.environ, "IDEMPAY_DATABASE_URL": pg_url(name)}

    def run(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "api", *args],
            cwd=ROOT, env=env, capture_output=True, text=True, check=True, timeout=120,
        )  # fmt: skip
        return done.stdout

    try:
        run("migrate")
        first = _psql(name, "SELECT epoch FROM database_epoch")
        assert len(first) == 36
        run("migrate")
        assert _psql(name, "SELECT epoch FROM database_epoch") == first
        out = run("admin", "new-epoch")
        renewed = _psql(name, "SELECT epoch FROM database_epoch")
        assert renewed != first and len(renewed) == 36
        assert f"previous epoch: {first}" in out and f"new epoch: {renewed}" in out
        assert _psql(name, "SELECT count(*) FROM database_epoch") == "1"
    finally:
        drop_database(name)
