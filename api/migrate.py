"""Apply Alembic migrations to the configured database (``idempay migrate`` and ``serve``),
and on Citus distribute the tables by merchant (docs/scaling.md, "Postgres → Citus").

Citus is detected, not configured: when the database has the ``citus`` extension, every
migration run ends — inside the same transaction and under the same migration lock —
with ``distribute``, which makes each table below what it must be and skips the ones that
already are, so it is as idempotent as the migrations themselves.
"""

from __future__ import annotations

import asyncio
import fcntl
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import text
from sqlalchemy.engine import Connection

from api.config import Settings

MIGRATIONS = Path(__file__).with_name("migrations")
# Postgres advisory lock held (per transaction) while migrations run: replicas that start
# together (each `idempay serve` migrates) take turns; the later ones find the schema at head.
MIGRATION_LOCK = 0x1DE4_3160

# Sharded by merchant, colocated with the first (the same hash ranges on the same nodes): a
# merchant's key, transaction, ledger, advices, outbox and request events share one
# shard, so every statement of a create, lookup, abort or reversal routes to one node.
DISTRIBUTED = (
    "idempotency_key",
    "transaction",
    "ledger_entry",
    "acquirer_advice",
    "outbox_event",
    "merchant_outbox_seq",
    "request_event",
)
# Small, read by every node, written rarely (by operators): a copy on each node.
REFERENCE = (
    "merchant",
    "api_key",
    "database_epoch",
    "webhook_endpoint",
    "webhook_delivery",
)
# Left on the coordinator, which only ``idempay migrate`` reads.
LOCAL = ("alembic_version",)
DISTRIBUTION_COLUMN = "merchant_id"
# request_event's unique constraint on event_id alone: plain Postgres and SQLite keep it
# through migration 0009's release (expand/contract); a distributed table cannot have it.
EVENT_ID_ONLY = "uq_request_event_event_id"


def alembic_config(settings: Settings) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("file_template", "%%(year)d_%%(month).2d_%%(day).2d_%%(rev)s_%%(slug)s")
    config.set_main_option("sqlalchemy.url", settings.resolved_database_url.replace("%", "%%"))
    return config


def migrate(settings: Settings) -> None:
    """Upgrade to head (and distribute, on Citus) and make sure the database has its epoch
    (contract §3.6; kept, never renewed here: ``idempay admin new-epoch`` does that after a
    restore). Runs its own event loops: call it outside a running loop."""
    if settings.is_sqlite:
        settings.var_dir.mkdir(parents=True, exist_ok=True)
    with _sqlite_migration_lock(settings):
        command.upgrade(alembic_config(settings), "head")
        asyncio.run(_ensure_epoch(settings))


@contextmanager
def _sqlite_migration_lock(settings: Settings) -> Iterator[None]:
    """SQLite's counterpart of Postgres's migration lock: an exclusive ``flock`` on
    ``<var_dir>/migrate.lock``, held for the whole run. A second ``idempay migrate`` (or
    ``serve``) started meanwhile waits for it, then finds the schema at head — where it used
    to fail with "database is locked" half-way. The kernel drops the lock when its holder
    exits, killed or not, so a crashed run never leaves the next one waiting."""
    if not settings.is_sqlite:
        yield
        return
    path = settings.var_dir / "migrate.lock"
    with path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            sys.stderr.write(f"waiting for another migration to finish (lock: {path})\n")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def has_citus(connection: Connection) -> bool:
    if connection.dialect.name != "postgresql":
        return False
    found = connection.execute(text("SELECT 1 FROM pg_extension WHERE extname = 'citus'"))
    return found.first() is not None


def distribute(connection: Connection) -> list[str]:
    """On Citus: reference tables, then the merchant-sharded tables colocated with
    ``idempotency_key`` (its shard count: the coordinator's ``citus.shard_count``). Runs in
    the migration's transaction, after the migrations; returns the tables it distributed. A
    table distributed some other way (another column, another colocation group) is an error."""
    if not has_citus(connection):
        return []
    current = {
        str(name)
        for (name,) in connection.execute(
            text("SELECT relname FROM pg_dist_partition JOIN pg_class ON oid = logicalrelid")
        )
    }
    done: list[str] = []
    copied: list[str] = []
    for table in REFERENCE + DISTRIBUTED:
        if table in current:
            continue
        had_rows = connection.execute(text(f'SELECT 1 FROM "{table}" LIMIT 1')).first() is not None
        name = f'"{table}"'
        if table == "request_event":  # kept by 0009 on a database without Citus back then
            connection.execute(
                text(f"ALTER TABLE {name} DROP CONSTRAINT IF EXISTS {EVENT_ID_ONLY}")
            )
        if table in REFERENCE:
            connection.execute(text("SELECT create_reference_table(:t)"), {"t": name})
        else:
            connection.execute(
                text("SELECT create_distributed_table(:t, :column, colocate_with => :colocate)"),
                {
                    "t": name,
                    "column": DISTRIBUTION_COLUMN,
                    "colocate": "default" if table == DISTRIBUTED[0] else DISTRIBUTED[0],
                },
            )
        if had_rows:
            copied.append(name)
        done.append(table)
    for name in copied:  # the rows went to the shards: drop the coordinator's own copies
        connection.execute(
            text("SELECT truncate_local_data_after_distributing_table(:t)"), {"t": name}
        )
    check_distribution(connection)
    return done


def check_distribution(connection: Connection) -> None:
    """Raise unless every table is placed as ``DISTRIBUTED`` / ``REFERENCE`` say."""
    placed = {
        str(name): (str(method), str(column or ""), int(colocation))
        for name, method, column, colocation in connection.execute(
            text(
                "SELECT relname, partmethod::text, "
                "column_to_column_name(logicalrelid, partkey), colocationid "
                "FROM pg_dist_partition JOIN pg_class ON oid = logicalrelid"
            )
        )
    }
    anchor = placed.get(DISTRIBUTED[0])
    for table in DISTRIBUTED:
        found = placed.get(table)
        if (
            found is None
            or anchor is None
            or found[:2] != ("h", DISTRIBUTION_COLUMN)
            or found[2] != anchor[2]
        ):
            raise RuntimeError(
                f"citus: {table} is {found}, not hash-distributed by {DISTRIBUTION_COLUMN} "
                f"and colocated with {DISTRIBUTED[0]} ({anchor})"
            )
    for table in REFERENCE:
        found = placed.get(table)
        if found is None or found[0] != "n":
            raise RuntimeError(f"citus: {table} is {found}, not a reference table")


async def _ensure_epoch(settings: Settings) -> None:
    from api.db import create_engine
    from api.idempotency.epoch import ensure_epoch

    engine = create_engine(settings)
    try:
        await ensure_epoch(engine)
    finally:
        await engine.dispose()
