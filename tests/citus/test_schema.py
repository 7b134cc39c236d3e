"""``idempay migrate`` on Citus: the tables distributed by merchant and colocated, the small
ones as reference tables, an existing database's rows moved onto the shards — and a second
run changes nothing. 0014 drops ``issuer_authorization``, distributed until 0013, with its
shards."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy.ext.asyncio import create_async_engine

import api.migrate
from api.config import Settings
from api.migrate import DISTRIBUTED, REFERENCE, alembic_config, distribute, migrate
from tests.api.test_migrations import SEED_0004, issuer_key
from tests.support.backend import Backend
from tests.support.citus import CitusCluster, query

PLACEMENT = (
    "SELECT relname, partmethod::text AS method, colocationid, "
    "column_to_column_name(logicalrelid, partkey) AS column "
    "FROM pg_dist_partition JOIN pg_class ON oid = logicalrelid"
)


def placement(dsn: str) -> dict[str, tuple[str, int, str | None]]:
    return {
        r["relname"]: (r["method"], r["colocationid"], r["column"]) for r in query(dsn, PLACEMENT)
    }


def test_migrate_distributes_by_merchant_colocated(citus_db: Backend, citus: CitusCluster) -> None:
    dsn = citus_db.url.replace("+asyncpg", "")
    placed = placement(dsn)
    anchor = placed["idempotency_key"]
    for table in DISTRIBUTED:
        assert placed[table] == ("h", anchor[1], "merchant_id"), table
    for table in REFERENCE:
        assert placed[table][0] == "n", table
    assert "alembic_version" not in placed  # the coordinator's own
    shards = query(
        dsn,
        "SELECT count(DISTINCT nodeport) FROM pg_dist_shard JOIN pg_dist_placement "
        "USING (shardid) JOIN pg_dist_node USING (groupid) "
        "WHERE logicalrelid = 'idempotency_key'::regclass",
    )
    assert shards[0][0] == 2  # the shards are spread over both workers
    migrate(citus_db.settings)  # idempotent: at head and distributed, nothing to do
    assert placement(dsn) == placed


def test_an_existing_database_moves_onto_the_shards(citus: CitusCluster, tmp_path: Path) -> None:
    """A database at 0004 with rows, on a Citus coordinator: ``idempay migrate`` gives the keys
    their merchant (0008), drops the issuer records (0014), then distributes — every row is on
    its merchant's shard after."""
    url = citus.url(citus.database("idempay_citus_existing"))
    settings = Settings(database_url=url, var_dir=tmp_path / "var")
    backend = Backend("citus", url, tmp_path)
    command.upgrade(alembic_config(settings), "0004")  # not at head: nothing distributed yet
    assert placement(url.replace("+asyncpg", "")) == {}
    for statement in SEED_0004:
        backend.sql(statement)
    migrate(settings)
    dsn = url.replace("+asyncpg", "")
    assert set(placement(dsn)) == set(DISTRIBUTED) | set(REFERENCE)
    for table in ("ledger_entry", "request_event", "outbox_event", '"transaction"'):
        assert backend.sql(f"SELECT count(*) FROM {table}")[0][0] == 1, table
    assert backend.sql("SELECT to_regclass('issuer_authorization')")[0][0] is None
    # the rows are on the merchant's shards (counted there, shard by shard)
    for table in DISTRIBUTED:
        on_shards = query(
            dsn,
            "SELECT coalesce(sum(result::bigint), 0) FROM run_command_on_shards($1, "
            "'SELECT count(*) FROM %s')",
            table,
        )[0][0]
        expected = 0 if table in ("merchant_outbox_seq", "acquirer_advice") else 1
        assert on_shards == expected, table


ISSUER_SHARDS = (
    "SELECT coalesce(sum(result::bigint), 0) FROM run_command_on_workers("
    "$$SELECT count(*) FROM pg_class WHERE relname LIKE 'issuer_authorization%'$$)"
)


def distribute_as_0013_did(url: str) -> None:
    """``api.migrate.distribute`` with 0013's list: ``issuer_authorization`` distributed too."""

    async def run() -> None:
        engine = create_async_engine(url)
        try:
            async with engine.begin() as conn:
                await conn.run_sync(distribute)
        finally:
            await engine.dispose()

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(api.migrate, "DISTRIBUTED", (*DISTRIBUTED, "issuer_authorization"))
        asyncio.run(run())


def test_0014_drops_the_distributed_issuer_table_and_its_shards(
    citus: CitusCluster, tmp_path: Path
) -> None:
    """A database at 0013 as 0013's code left it (``issuer_authorization`` distributed by
    merchant, colocated with the keys, records on the shards): ``idempay migrate`` drops the
    table, its shards on the workers too; the other rows stay where they were."""
    url = citus.url(citus.database("idempay_citus_0014"))
    settings = Settings(database_url=url, var_dir=tmp_path / "var")
    backend = Backend("citus", url, tmp_path)
    dsn = url.replace("+asyncpg", "")
    command.upgrade(alembic_config(settings), "0004")
    for statement in SEED_0004:
        backend.sql(statement)
    command.upgrade(alembic_config(settings), "0013")  # not at head: nothing distributed
    distribute_as_0013_did(url)
    owners = dict(backend.sql("SELECT issuer_key, merchant_id FROM issuer_authorization"))
    assert owners == {issuer_key("mer_a", "k1"): "mer_a", "orphan": ""}
    assert query(dsn, ISSUER_SHARDS)[0][0] > 0
    migrate(settings)
    assert backend.sql("SELECT to_regclass('issuer_authorization')")[0][0] is None
    assert "issuer_authorization" not in placement(dsn)
    assert query(dsn, ISSUER_SHARDS)[0][0] == 0  # no shard left on any worker
    assert set(placement(dsn)) == set(DISTRIBUTED) | set(REFERENCE)
    for table in ("ledger_entry", "request_event", "outbox_event", '"transaction"'):
        assert backend.sql(f"SELECT count(*) FROM {table}")[0][0] == 1, table
