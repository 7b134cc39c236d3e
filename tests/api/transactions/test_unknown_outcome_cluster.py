"""Creates whose commit reached the WAL before their session was cut are never answered 503
("nothing was processed"): a real server on a private PostgreSQL cluster (contract §2.2,
"Decision"; api/transactions/unknown_outcome.py).

The cluster has a synchronous standby that never answers (``synchronous_standby_names``):
every commit record — a create's claim, then its finish — is written and flushed locally,
then its backend waits for the standby: committed, not yet acknowledged. Its session is then
cut: ``pg_terminate_backend`` (57P01), ``kill -9`` of the backend (the postmaster ends every
backend, 57P02, and recovers), or a crash of the whole cluster (``pg_ctl stop -m immediate``)
and a restart. A create whose claim committed was processed (its key is never released: its
0200 may have left); its answer must be 201 (its key read back), 202 (the server finishes
it) or 409 in flight — never 503, which is kept for keys with no claim at all. At the end
every key answered anything but 201 is sent again with the same key: one transaction each,
none twice.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from idempay_tools._chaos_pgkill import How, create_backends, cut_create_backend
from idempay_tools.private_services import PrivatePostgres
from tests.support.backend import Backend
from tests.support.client import body
from tests.support.private_cluster import private_cluster

pytestmark = pytest.mark.server

CREATES = 8


class _Cluster:
    def __init__(self, pg: PrivatePostgres, backend: Backend) -> None:
        self.pg = pg
        self.backend = backend
        self.dsn = f"postgresql://postgres@127.0.0.1:{pg.port}/postgres"

    async def sql(self, statement: str) -> None:
        # The cluster may be recovering from a cut: a connection refused, or one ended by the
        # postmaster mid-statement (ALTER SYSTEM and pg_reload_conf are idempotent).
        for _ in range(300):
            try:
                conn = await asyncpg.connect(self.dsn, timeout=2)
            except (TimeoutError, OSError, asyncpg.PostgresError):
                await asyncio.sleep(0.1)
                continue
            try:
                await conn.execute(statement, timeout=10)
                return
            except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
                await asyncio.sleep(0.1)
            finally:
                conn.terminate()
        raise AssertionError("the cluster did not come back")

    async def standby_that_never_answers(self, on: bool) -> None:
        value = "SET synchronous_standby_names = 'idempay_nobody'" if on else "RESET ALL"
        # (a private cluster: nothing else is set with ALTER SYSTEM)
        await self.sql(f"ALTER SYSTEM {value}")
        await self.sql("SELECT pg_reload_conf()")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[_Cluster]:
    with private_cluster("idempay-uo-pg-", tmp_path) as (pg, backend):
        yield _Cluster(pg, backend)


def _server(cluster: _Cluster) -> tuple[str, str]:
    server = cluster.backend.server(IDEMPAY_DB_TIMEOUT="2")
    return server.url, cluster.backend.api_key("m-unknown-cluster")


Chaos = Callable[[_Cluster, asyncio.Event], Coroutine[Any, Any, int]]


async def _run(
    cluster: _Cluster, url: str, api_key: str, chaos: Chaos
) -> tuple[dict[str, int], set[str], int]:
    """CREATES creates at once while ``chaos`` cuts their sessions (it returns how many it
    cut); then the standby is dropped. The first answer of each key, the keys committed
    before any was sent again, and the cuts. Each key not answered 201 is then sent again
    until it is (asserted here)."""
    keys = [str(uuid.uuid4()) for _ in range(CREATES)]
    await cluster.standby_that_never_answers(True)
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:

        async def post(key: str) -> int:
            r = await client.post(
                "/v1/transactions",
                json=body(amount=1000 + keys.index(key)),
                headers={"Authorization": f"Bearer {api_key}", "Idempotency-Key": key},
            )
            assert r.status_code in (201, 202, 409, 503), r.text
            return r.status_code

        done = asyncio.Event()
        cutting = asyncio.create_task(chaos(cluster, done))
        try:
            statuses = await asyncio.gather(*(post(key) for key in keys))
        finally:
            done.set()
            cuts = await cutting
        first = dict(zip(keys, statuses, strict=True))
        await cluster.standby_that_never_answers(False)
        await asyncio.sleep(0.5)  # a statement still waiting for the standby: released
        before = await _claimed(cluster)
        again = {}
        for key, status in first.items():
            if status != 201:
                for _ in range(150):  # a claim left behind settles within its lease (6 s)
                    again[key] = await post(key)
                    if again[key] == 201:
                        break
                    await asyncio.sleep(0.2)
    assert all(status == 201 for status in again.values()), again
    return first, before, cuts


async def _committed(cluster: _Cluster) -> dict[str, int]:
    conn = await asyncpg.connect(cluster.dsn)
    try:
        rows = await conn.fetch('SELECT id, count(*) FROM "transaction" GROUP BY id')
    finally:
        await conn.close()
    return {row[0]: row[1] for row in rows}


async def _claimed(cluster: _Cluster) -> set[str]:
    """The keys with a committed claim (any state): what a 503 must never have answered."""
    conn = await asyncpg.connect(cluster.dsn)
    try:
        rows = await conn.fetch("SELECT key FROM idempotency_key")
    finally:
        await conn.close()
    return {row[0] for row in rows}


def _cut_each(how: How) -> Chaos:
    async def chaos(cluster: _Cluster, done: asyncio.Event) -> int:
        cuts = 0
        while not done.is_set():
            pid = await cut_create_backend(
                cluster.dsn, how=how, batches_only=False, waiting_on="SyncRep", wait_s=0.3
            )
            cuts += pid is not None
        return cuts

    return chaos


async def _crash_once(cluster: _Cluster, done: asyncio.Event) -> int:
    for _ in range(500):
        if await create_backends(cluster.dsn, waiting_on="SyncRep"):
            break
        await asyncio.sleep(0.01)
    else:
        raise AssertionError("no create waited for the standby")
    await asyncio.to_thread(cluster.pg.crash)
    await asyncio.to_thread(cluster.pg.start)
    # Creates sent after the restart wait for the standby too: release them (they commit).
    await cluster.standby_that_never_answers(False)
    return 1


def _check(first: dict[str, int], before: set[str], committed: dict[str, int]) -> None:
    lied = [key for key, status in first.items() if status == 503 and key in before]
    assert not lied, f"503 for {len(lied)} claimed (processed) creates: {first}"
    assert all(key in before for key, status in first.items() if status == 201)
    assert set(committed) == set(first) and set(committed.values()) == {1}, committed


@pytest.mark.parametrize("how", ["terminate", "kill"])
def test_a_create_cut_after_its_commit_record_is_never_503(cluster: _Cluster, how: How) -> None:
    """``pg_terminate_backend`` / ``kill -9`` of each backend waiting for the standby: every
    claim or finish there is committed (locally); its answer is 201 from its key read back,
    202 while its finish waits, or 409 in flight while the cluster recovers — never 503."""
    first, before, cuts = asyncio.run(_run(cluster, *_server(cluster), _cut_each(how)))
    committed = asyncio.run(_committed(cluster))
    print(how, "cuts", cuts, "first", sorted(first.values()))
    assert cuts >= 1
    _check(first, before, committed)
    if how == "terminate":  # no crash: the keys are read back at once (201), or their
        # finish still waits for the standby past IDEMPAY_ANSWER_WITHIN (202)
        assert set(first.values()) <= {201, 202}, first


def test_a_cluster_crash_after_the_commit_record_is_never_503(cluster: _Cluster) -> None:
    """The whole cluster stops at once (no shutdown checkpoint) while creates wait for the
    standby, and starts again: their commits are recovered from the WAL; each is answered
    201 (read back once the cluster is up, within the request's budget), 202 or 409 in
    flight — never 503 for a claimed key."""
    first, before, _ = asyncio.run(_run(cluster, *_server(cluster), _crash_once))
    committed = asyncio.run(_committed(cluster))
    print("first", sorted(first.values()))
    _check(first, before, committed)
