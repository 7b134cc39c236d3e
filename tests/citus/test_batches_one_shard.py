"""Group commit on Citus under many merchants' concurrent creates: one shard per batch.

A batch must hold one merchant's writes (``GroupCommit._take``, ``partition_of``): a batch
spanning two workers would be a distributed transaction, which Citus commits by two-phase
commit — each worker then logs a ``PREPARE TRANSACTION``. Merchants on both workers pay at
once (many creates in flight, so claims and finishes queue and batch); the workers log every
statement of this database, and none may be a PREPARE. A transaction of the test's own that
writes two merchants' rows on both workers shows the check sees a PREPARE when there is one.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from datetime import datetime

import httpx

from tests.support.backend import Backend
from tests.support.citus import (
    CitusCluster,
    execute_sync,
    merchants_by_worker,
    query,
)
from tests.support.client import body, new_key, post_create

MERCHANTS = 8
PER_MERCHANT = 12


def _prepares(citus: CitusCluster, database: str, since: float) -> int:
    """PREPARE TRANSACTION statements the workers logged for ``database`` since ``since``
    (read raw: Citus's own connections are named ``citus_internal gpid=…``, with a space)."""
    count = 0
    for worker in citus.workers:
        for line in (worker.root / "log").read_text(errors="replace").splitlines():
            if f"db={database} " not in line or "PREPARE TRANSACTION" not in line.upper():
                continue
            moment = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S.%f").timestamp()
            count += moment >= since - 1
    return count


def test_concurrent_merchants_never_share_a_batch(citus_db: Backend, citus: CitusCluster) -> None:
    database = citus_db.url.rsplit("/", 1)[1]
    dsn = citus.coordinator.dsn(database)
    keys: dict[str, str] = {}
    ids: dict[str, str] = {}
    placed: dict[int, list[str]] = {}
    # MERCHANTS merchants, more while they all hash to one worker's shards (random ids: 8 of
    # them land on one worker once in 128 runs — seen once in CI)
    while len(keys) < MERCHANTS or (len(placed) < 2 and len(keys) < 4 * MERCHANTS):
        name = f"batch-{len(keys)}"
        keys[name] = citus_db.api_key(name)
        ids[name] = query(dsn, "SELECT id FROM merchant WHERE name = $1", name)[0][0]
        placed = merchants_by_worker(dsn, list(ids.values()))
    assert len(placed) == 2, placed  # merchants on both workers
    for worker in citus.workers:
        execute_sync(worker.dsn(), f"ALTER DATABASE \"{database}\" SET log_statement = 'all'")
    server = citus_db.server(IDEMPAY_DB_POOL_SIZE="6")
    time.sleep(1.0)
    since = time.time()

    async def pay() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            return await asyncio.gather(
                *(
                    post_create(client, api_key, new_key(), body(amount=100 + n))
                    for n in range(PER_MERCHANT)
                    for api_key in keys.values()
                )
            )

    answers = asyncio.run(pay())
    statuses = Counter(answer.status_code for answer in answers)
    print("statuses:", dict(statuses))
    time.sleep(1.0)
    during = _prepares(citus, database, since)
    # the check's control: one transaction writing two merchants' rows on both workers
    first, second = (merchants[0] for merchants in placed.values())
    execute_sync(
        dsn,
        "DO $$ BEGIN "
        f"UPDATE idempotency_key SET updated_at = updated_at WHERE merchant_id = '{first}'; "
        f"UPDATE idempotency_key SET updated_at = updated_at WHERE merchant_id = '{second}'; "
        "END $$",
    )
    time.sleep(1.0)
    control = _prepares(citus, database, since) - during
    print("PREPARE TRANSACTION on the workers: during the fleet", during, "control", control)
    for worker in citus.workers:
        execute_sync(worker.dsn(), f'ALTER DATABASE "{database}" RESET log_statement')
    assert control >= 1, "the check sees no 2PC: it proves nothing"
    assert statuses == Counter({201: len(keys) * PER_MERCHANT}), statuses
    assert during == 0
