"""Migrations: several replicas starting at once (each `idempay serve` migrates) must not
trip over each other on Postgres — one migrates, the others wait and find it done."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from sqlalchemy.ext.asyncio import create_async_engine

from api.config import Settings
from api.migrate import (
    DISTRIBUTED,
    LOCAL,
    MIGRATION_LOCK,
    REFERENCE,
    alembic_config,
    migrate,
)
from api.models import Base
from tests.support.backend import Backend
from tests.support.eventually import eventually
from tests.support.migrations import race_migrations
from tests.support.services import ROOT, create_database, drop_database, pg_url

# `idempay migrate` processes (eight at once) on throw-away databases: a kind the fast lane
# leaves out, marked here as tests/conftest.py finds none of its fixtures in this module.
pytestmark = pytest.mark.server


def test_concurrent_migrations_on_a_fresh_database_all_succeed(tmp_path: Path) -> None:
    name = create_database("idempay_mig")
    go = tmp_path / "go"
    try:
        env = {**os.environ, "IDEMPAY_DATABASE_URL": pg_url(name)}
        codes, outputs = race_migrations(env, 8, go, timeout=120)
        assert codes == [0] * 8, outputs
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
        held = (
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND "
            "database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        )
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
            # this database's holder only: advisory locks of every other database on the
            # shared server (other tests' leaders, guards, migrations) are none of ours
            "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' "
            "AND granted AND database = (SELECT oid FROM pg_database "
            "WHERE datname = current_database())",
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


# ------------------------------------------------------------------ 0008: merchant keys
# Every primary key and unique constraint of a merchant's data contains merchant_id (issue
# 18), so Citus can shard the tables by merchant; an existing database keeps its rows, and
# the simulator's issuer records get their merchant back from the key rows. The 0008 step is
# checked at 0012 (the last revision of its own series), not at head: 0014 drops
# issuer_authorization (the in-process issuer is gone), and its downgrade brings the table
# back empty — checked on its own below.

SECRET = Settings.model_fields["secret_key"].default  # what the migration derives with
MERCHANT_KEYS = {
    "ledger_entry": ["merchant_id", "entry_id"],
    "request_event": ["merchant_id", "event_id"],
    "idempotency_key": ["merchant_id", "key"],
    "transaction": ["merchant_id", "id"],
}
T0 = "'2026-11-20T10:00:00+00:00'"


def issuer_key(merchant_id: str, key: str) -> str:
    digest = hmac.new(SECRET.encode(), f"{merchant_id}:{key}".encode(), hashlib.sha256)
    return digest.hexdigest()[:40]


SEED_0004 = [
    f"INSERT INTO merchant (id, name, created_at) VALUES ('mer_a', 'a', {T0})",
    "INSERT INTO idempotency_key (merchant_id, key, state, lease_token, created_at, updated_at)"
    f" VALUES ('mer_a', 'k1', 'completed', 1, {T0}, {T0})",
    'INSERT INTO "transaction" (merchant_id, id, terminal_id, type, amount, currency, card_last4,'
    " card_brand, card_fingerprint, installments, status, created_at, processed_at) VALUES"
    f" ('mer_a', 'k1', 'T1', 'sale', 100, 'BRL', '4242', 'visa', 'fp', 1, 'approved', {T0}, {T0})",
    "INSERT INTO ledger_entry (entry_id, merchant_id, transaction_id, amount, currency, kind,"
    f" created_at) VALUES ('e1', 'mer_a', 'k1', 100, 'BRL', 'charge', {T0})",
    "INSERT INTO outbox_event (event_id, merchant_id, type, transaction_id, payload, created_at)"
    f" VALUES ('ev1', 'mer_a', 'transaction.completed', 'k1', '{{}}', {T0})",
    "INSERT INTO request_event (event_id, ts, merchant_id, endpoint, outcome, http_status,"
    f" latency_ms) VALUES ('re1', {T0}, 'mer_a', 'create', 'created', 201, 1.5)",
    "INSERT INTO issuer_authorization (issuer_key, result, amount, currency, calls, created_at)"
    f" VALUES ('{issuer_key('mer_a', 'k1')}', 'approved', 100, 'BRL', 1, {T0})",
    # a purged tombstone's void: no key row names it any more
    "INSERT INTO issuer_authorization (issuer_key, result, amount, currency, calls, created_at)"
    f" VALUES ('orphan', 'voided', 100, 'BRL', 0, {T0})",
]


def upgrade_with_rows(settings: Settings, revision: str) -> Callable[[str], list[Any]]:
    """0004 with one merchant's rows, then up to ``revision`` (one with issuer records,
    0008–0013: theirs have their merchant); the SQL runner."""
    if settings.is_sqlite:
        settings.var_dir.mkdir(parents=True, exist_ok=True)
    backend = Backend("x", settings.database_url, settings.var_dir.parent)
    command.upgrade(alembic_config(settings), "0004")
    for statement in SEED_0004:
        backend.sql(statement)
    command.upgrade(alembic_config(settings), revision)
    owners = dict(backend.sql("SELECT issuer_key, merchant_id FROM issuer_authorization"))
    assert owners == {issuer_key("mer_a", "k1"): "mer_a", "orphan": ""}
    return backend.sql


def issuer_table(settings: Settings) -> list[str] | None:
    """issuer_authorization's primary key columns, or None when the table is gone."""

    def read(connection: Any) -> list[str] | None:
        inspector = sa.inspect(connection)
        if not inspector.has_table("issuer_authorization"):
            return None
        return list(inspector.get_pk_constraint("issuer_authorization")["constrained_columns"])

    async def run() -> list[str] | None:
        engine = create_async_engine(settings.resolved_database_url)
        try:
            async with engine.connect() as conn:
                return await conn.run_sync(read)
        finally:
            await engine.dispose()

    return asyncio.run(run())


def inspect(settings: Settings, read: Callable[[Any, str], Any]) -> dict[str, Any]:
    """``read(inspector, table)`` for every table of the models."""

    async def run() -> dict[str, Any]:
        engine = create_async_engine(settings.resolved_database_url)
        try:
            async with engine.connect() as conn:
                return await conn.run_sync(
                    lambda c: {
                        t: read(sa.inspect(c), t)
                        for t in Base.metadata.tables
                        if sa.inspect(c).has_table(t)  # at an older revision: not all yet
                    }
                )
        finally:
            await engine.dispose()

    return asyncio.run(run())


def primary_keys(settings: Settings) -> dict[str, list[str]]:
    return inspect(settings, lambda i, t: i.get_pk_constraint(t)["constrained_columns"])


def check_merchant_keys(
    settings: Settings, sql: Callable[[str], list[Any]], *, issuer_records: bool
) -> None:
    """0008's keys and rows; ``issuer_records``: issuer_authorization still there (0008 to
    0013: keyed by merchant, its rows kept and owned), else dropped (0014 on)."""
    keys = primary_keys(settings)
    for table, columns in MERCHANT_KEYS.items():
        assert keys[table] == columns, table
    # SQLite numbers only a one-column INTEGER primary key by itself (the relay orders by it)
    assert keys["outbox_event"] == (["id"] if settings.is_sqlite else ["merchant_id", "id"])
    uniques = inspect(settings, lambda i, t: i.get_unique_constraints(t))["outbox_event"]
    assert sorted(u["column_names"] for u in uniques) == [
        ["merchant_id", "event_id"],
        ["merchant_id", "seq"],
    ]
    for table in ("ledger_entry", "request_event", "outbox_event", '"transaction"'):
        assert sql(f"SELECT count(*) FROM {table}")[0][0] == 1, table
    uniques = inspect(settings, lambda i, t: i.get_unique_constraints(t))["request_event"]
    # 0008 added (event_id) for the writers before 3f04565; 0009 drops it on Citus only:
    # plain Postgres and SQLite keep it through that release (expand/contract)
    assert [(u["name"], u["column_names"]) for u in uniques] == [
        ("uq_request_event_event_id", ["event_id"])
    ]
    if issuer_records:
        assert issuer_table(settings) == ["merchant_id", "issuer_key"]
        owners = dict(sql("SELECT issuer_key, merchant_id FROM issuer_authorization"))
        assert owners == {issuer_key("mer_a", "k1"): "mer_a", "orphan": ""}
    else:
        assert issuer_table(settings) is None


def the_0008_step(settings: Settings) -> None:
    """Up to 0012 with rows; down to 0004 (the old keys, every row kept); up to 0012 again:
    the same result."""
    sql = upgrade_with_rows(settings, "0012")
    check_merchant_keys(settings, sql, issuer_records=True)
    command.downgrade(alembic_config(settings), "0004")
    keys = primary_keys(settings)
    assert keys["ledger_entry"] == ["entry_id"]
    assert issuer_table(settings) == ["issuer_key"]
    assert sql("SELECT count(*) FROM issuer_authorization")[0][0] == 2
    command.upgrade(alembic_config(settings), "0012")
    check_merchant_keys(settings, sql, issuer_records=True)
    command.upgrade(alembic_config(settings), "0012")  # there already: nothing changes
    check_merchant_keys(settings, sql, issuer_records=True)


def the_0014_step(settings: Settings) -> None:
    """From 0013 with rows to head: issuer_authorization dropped, 0008's keys and every
    other row kept; down to 0013: the table back, empty, keyed by merchant; head again."""
    sql = upgrade_with_rows(settings, "0013")
    migrate(settings)
    check_merchant_keys(settings, sql, issuer_records=False)
    command.downgrade(alembic_config(settings), "0013")
    assert issuer_table(settings) == ["merchant_id", "issuer_key"]
    assert sql("SELECT count(*) FROM issuer_authorization")[0][0] == 0  # not kept by 0014
    migrate(settings)
    check_merchant_keys(settings, sql, issuer_records=False)
    migrate(settings)  # at head: nothing to do, nothing changes
    check_merchant_keys(settings, sql, issuer_records=False)


def test_0008_puts_the_merchant_in_every_key_on_postgres(tmp_path: Path) -> None:
    name = create_database("idempay_mig")
    try:
        the_0008_step(Settings(database_url=pg_url(name), var_dir=tmp_path / "var"))
    finally:
        drop_database(name)


def test_0008_puts_the_merchant_in_every_key_on_sqlite(tmp_path: Path) -> None:
    the_0008_step(Settings(database_url=None, var_dir=tmp_path / "var"))


def test_0014_drops_the_issuer_records_and_keeps_the_rest_on_postgres(tmp_path: Path) -> None:
    name = create_database("idempay_mig")
    try:
        the_0014_step(Settings(database_url=pg_url(name), var_dir=tmp_path / "var"))
    finally:
        drop_database(name)


def test_0014_drops_the_issuer_records_and_keeps_the_rest_on_sqlite(tmp_path: Path) -> None:
    the_0014_step(Settings(database_url=None, var_dir=tmp_path / "var"))


def test_every_table_has_a_place_on_citus() -> None:
    """A new table must be placed (distributed by merchant, reference, or left on the
    coordinator) before ``idempay migrate`` can put it on Citus; a distributed one has
    merchant_id in its primary key and in every unique constraint."""
    placed = set(DISTRIBUTED) | set(REFERENCE) | set(LOCAL)
    assert set(Base.metadata.tables) <= placed, set(Base.metadata.tables) - placed
    assert not set(DISTRIBUTED) & set(REFERENCE)
    for name in DISTRIBUTED:
        table = Base.metadata.tables[name]
        assert "merchant_id" in table.primary_key.columns, name
        for constraint in table.constraints:
            if isinstance(constraint, sa.UniqueConstraint):
                assert "merchant_id" in constraint.columns, (name, constraint.name)
