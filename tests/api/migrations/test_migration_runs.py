"""Review findings 2–4 (issue 18): how 0008/0009 and ``idempay migrate`` run on a database
that already holds data and serves traffic.

2. 0008's backfill walks the key rows by a keyset on the primary key (a row comparison);
   across several chunks it names every record's merchant, as before.
3. 0009 keeps request_event's unique constraint on event_id on plain Postgres and SQLite, so
   a writer older than 3f04565 (``ON CONFLICT (event_id)``) still writes during the rolling
   update; it went on every flush before.
4. Two ``idempay migrate`` at once on SQLite: the second waits for the first and succeeds;
   one used to exit 1 with "database is locked".
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import hmac
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from sqlalchemy.ext.asyncio import create_async_engine

from api.config import Settings
from api.migrate import alembic_config, migrate
from tests.support.backend import Backend
from tests.support.eventually import eventually
from tests.support.migrations import race_migrations
from tests.support.services import ROOT, create_database, drop_database, pg_url

pytestmark = pytest.mark.server

SECRET = Settings.model_fields["secret_key"].default
T0 = datetime(2026, 11, 20, 10, 0, tzinfo=UTC)


@pytest.fixture(params=["postgres", "sqlite"])
def fresh(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    name = create_database("mig_review") if request.param == "postgres" else None
    try:
        backend = Backend(request.param, pg_url(name) if name else None, tmp_path)
        backend.settings.var_dir.mkdir(parents=True, exist_ok=True)
        yield backend
    finally:
        if name:
            drop_database(name)


def many(backend: Backend, statement: str, rows: list[dict[str, Any]]) -> None:
    async def run() -> None:
        engine = create_async_engine(backend.url)
        try:
            async with engine.begin() as conn:
                await conn.execute(sa.text(statement), rows)
        finally:
            await engine.dispose()

    asyncio.run(run())


def test_0008_backfill_crosses_chunks_and_merchants(fresh: Backend) -> None:
    """12,001 keys over three merchants (three 5,000-key chunks, the boundaries inside a
    merchant): every issuer record gets its merchant, the orphan keeps ''."""
    command.upgrade(alembic_config(fresh.settings), "0007")
    keys = [(f"mer_{i % 3}", str(uuid.uuid4())) for i in range(12_001)]
    many(
        fresh,
        "INSERT INTO idempotency_key (merchant_id, key, state, lease_token, created_at,"
        " updated_at) VALUES (:m, :k, 'completed', 1, :t, :t)",
        [{"m": m, "k": k, "t": T0} for m, k in keys],
    )

    def issuer_key(m: str, k: str) -> str:
        return hmac.new(SECRET.encode(), f"{m}:{k}".encode(), hashlib.sha256).hexdigest()[:40]

    many(
        fresh,
        "INSERT INTO issuer_authorization (issuer_key, result, amount, currency, calls,"
        " created_at) VALUES (:i, 'approved', 100, 'BRL', 1, :t)",
        [{"i": issuer_key(m, k), "t": T0} for m, k in keys] + [{"i": "orphan", "t": T0}],
    )
    command.upgrade(alembic_config(fresh.settings), "0008")
    owners = dict(fresh.sql("SELECT issuer_key, merchant_id FROM issuer_authorization"))
    assert owners == {issuer_key(m, k): m for m, k in keys} | {"orphan": ""}


OLD_WRITER = (  # api/events/writer.py before 3f04565: the conflict target is event_id alone
    "INSERT INTO request_event (event_id, ts, merchant_id, endpoint, outcome, http_status,"
    " latency_ms) VALUES (:e, :t, 'mer_a', 'create', 'created', 201, 1.5)"
    " ON CONFLICT (event_id) DO NOTHING"
)


def test_a_writer_older_than_3f04565_still_writes_at_head(fresh: Backend) -> None:
    """The rolling update of 0009's release: old replicas flush with ON CONFLICT (event_id)."""
    migrate(fresh.settings)
    assert [u["column_names"] for u in uniques(fresh)] == [["event_id"]]
    event = str(uuid.uuid4())
    fresh.sql(OLD_WRITER, e=event, t=T0)
    fresh.sql(OLD_WRITER, e=event, t=T0)  # a retried batch: nothing twice
    assert fresh.sql("SELECT count(*) FROM request_event")[0][0] == 1
    # the current writer's target, the table's key, works beside it
    fresh.sql(OLD_WRITER.replace("(event_id) DO", "(merchant_id, event_id) DO"), e=event, t=T0)
    assert fresh.sql("SELECT count(*) FROM request_event")[0][0] == 1


def test_0009_on_a_database_that_already_dropped_it_is_left_as_it_is(fresh: Backend) -> None:
    """A database that ran 0009 as first shipped (constraint dropped): idempay migrate does
    not recreate it (docs/operations.md says why), and the current writer's target works."""
    migrate(fresh.settings)

    async def drop() -> None:  # what 0009 as first shipped did
        engine = create_async_engine(fresh.url)
        try:
            async with engine.begin() as conn:
                await conn.run_sync(_drop_with_batch)
        finally:
            await engine.dispose()

    asyncio.run(drop())
    migrate(fresh.settings)
    assert uniques(fresh) == []  # not recreated (docs/operations.md)
    event = str(uuid.uuid4())
    current = OLD_WRITER.replace("(event_id) DO", "(merchant_id, event_id) DO")
    fresh.sql(current, e=event, t=T0)
    fresh.sql(current, e=event, t=T0)
    assert fresh.sql("SELECT count(*) FROM request_event")[0][0] == 1


def uniques(backend: Backend) -> list[Any]:
    async def run() -> list[Any]:
        engine = create_async_engine(backend.url)
        try:
            async with engine.connect() as conn:
                return await conn.run_sync(
                    lambda c: sa.inspect(c).get_unique_constraints("request_event")
                )
        finally:
            await engine.dispose()

    return asyncio.run(run())


def _drop_with_batch(connection: sa.Connection) -> None:
    from alembic.migration import MigrationContext
    from alembic.operations import Operations

    operations = Operations(MigrationContext.configure(connection))
    with operations.batch_alter_table("request_event") as batch:
        batch.drop_constraint("uq_request_event_event_id", type_="unique")


def sqlite_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "IDEMPAY_DATABASE_URL"}


def test_concurrent_migrations_on_sqlite_all_succeed(tmp_path: Path) -> None:
    """Four ``idempay migrate`` released together on one SQLite file: all exit 0, one
    migrated, the others waited and found it at head."""
    go = tmp_path / "go"
    env = {**sqlite_env(), "IDEMPAY_VAR_DIR": str(tmp_path / "var")}
    codes, outputs = race_migrations(env, 4, go, timeout=180)
    assert codes == [0] * 4, outputs
    settings = Settings(database_url=None, var_dir=tmp_path / "var")
    backend = Backend("sqlite", None, tmp_path)
    assert backend.sql("SELECT count(*) FROM alembic_version")[0][0] == 1
    assert backend.sql("SELECT count(*) FROM database_epoch")[0][0] == 1
    assert settings.var_dir.joinpath("migrate.lock").exists()


def test_a_sqlite_migration_waits_for_the_one_running(tmp_path: Path) -> None:
    """Deterministic: while the lock is held (as a running migration holds it), ``idempay
    migrate`` says it waits, creates nothing; once released it completes, exit 0."""
    var = tmp_path / "var"
    var.mkdir()
    env = {**sqlite_env(), "IDEMPAY_VAR_DIR": str(var)}
    with (var / "migrate.lock").open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        proc = subprocess.Popen(
            [sys.executable, "-m", "api", "migrate"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stderr is not None
            line = proc.stderr.readline()
            assert line.startswith("waiting for another migration to finish"), line
            assert proc.poll() is None
            database = var / "idempay.db"
            assert not database.exists() or database.stat().st_size == 0
        finally:
            fcntl.flock(held, fcntl.LOCK_UN)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, (out, err)
    eventually(
        lambda: Backend("sqlite", None, tmp_path).sql("SELECT count(*) FROM alembic_version"),
        until=lambda rows: rows[0][0] == 1,
        what="the schema at head",
        timeout=5,
    )
