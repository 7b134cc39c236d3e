"""The duplicate guard on Citus (a private coordinator + 2 workers, ``scripts/citus.sh``):
migration 0010 runs on a database that ``idempay migrate`` distributes, and the guard —
checked in the claim's transaction, with the coordinator's advisory lock — blocks, overrides
and refuses racing keys for a sale already approved as on Postgres (contract §2.2: it orders
the claims, not the sales — tests/api/guard/test_guard.py pins what a race of keys none of
which is approved yet may do)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from fastapi import FastAPI

from api.auth import create_api_key
from api.config import Settings
from api.migrate import migrate
from api.transactions.guard import set_window
from tests.api.guard.conftest import Merchant, new_key
from tests.api.guard.test_guard import (
    OVERRIDE,
    blocked,
    nothing_stored,
    racing_keys_charge_once,
)
from tests.support.asgi import asgi_client, running_app
from tests.support.citus import BUILD_TIMEOUT, CitusCluster
from tests.support.client import body

pytestmark = [pytest.mark.server, pytest.mark.timeout(BUILD_TIMEOUT)]


@pytest.fixture(scope="module")
def cluster(citus: CitusCluster) -> CitusCluster:
    """The run's Citus cluster (tests/conftest.py); this module's database is its own."""
    return citus


@pytest.fixture(scope="module")
def citus_settings(cluster: CitusCluster, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    settings = Settings(
        database_url=cluster.url(cluster.database()),
        var_dir=tmp_path_factory.mktemp("citus-guard") / "var",
        redis_url=None,
        rate_limit="100000/second",
        rate_limit_terminal="100000/second",
        auth_failure_limit="100000/minute",
        event_flush_interval=0.05,
        db_pool_size=8,
    )
    migrate(settings)  # 0010 included; then distributed
    return settings


@pytest.fixture(scope="module")
async def app(citus_settings: Settings) -> AsyncIterator[FastAPI]:
    async with running_app(citus_settings) as application:
        yield application


@pytest.fixture
async def guarded(app: FastAPI) -> AsyncIterator[Merchant]:
    engine = app.state.ctx.engine
    name = f"guard-{uuid.uuid4().hex[:10]}"
    api_key = await create_api_key(engine, name)
    await set_window(engine, name, 120)
    async with asgi_client(app) as http:
        yield Merchant(app, http, api_key, name)


async def test_the_guard_blocks_and_is_overridden_on_citus(guarded: Merchant) -> None:
    placed = await guarded.sql(
        "SELECT count(*) FROM pg_dist_partition WHERE logicalrelid = '\"transaction\"'::regclass"
    )
    assert placed == [(1,)]  # the table the guard reads is distributed
    first, second = new_key(), new_key()
    assert (await guarded.create(first)).status_code == 201
    blocked(await guarded.create(second), first)
    await nothing_stored(guarded, second)
    assert await guarded.create_events(second) == [("rejected", 409)]
    assert (await guarded.create(second, body(**OVERRIDE))).status_code == 201
    assert bool((await guarded.transaction(second))[1])


async def test_new_keys_racing_for_one_sale_charge_once_on_citus(guarded: Merchant) -> None:
    await racing_keys_charge_once(guarded, 6)
