"""A merchant's shard moved to the other worker while its terminals pay (issue 18).

``citus_move_shard_placement`` copies the shard group (the merchant's key, transaction,
ledger, issuer, outbox and event shards, colocated) to the other worker by logical
replication, briefly blocks writes to catch up, and switches the placement. The merchant's
terminals pay all along: no payment lost, none doubled — every key answered 201 is held
exactly once, contract §8 holds, and the shard is on the other worker after.

A claim that waits on the move's write block longer than its lock timeout (250 ms, contract
§2.2) is answered 409 ``request_in_progress``: nothing of it was written, so its lookup
answers 404 and the same key sent again is processed. Under a loaded machine the block can
last that long; only then, and only while the shard moves, may a create see a 409.
"""

from __future__ import annotations

import threading
import time

from tests.citus.fleet import Fleet, invariants
from tests.support.backend import Backend
from tests.support.citus import CitusCluster, execute_sync, query
from tests.support.client import Api

TERMINALS = 4  # the merchant's terminals paying during the move


def placement(dsn: str, merchant_id: str) -> tuple[int, int]:
    row = query(
        dsn,
        "SELECT s.shardid, p.nodeport FROM pg_dist_shard_placement p JOIN pg_dist_shard s "
        "USING (shardid) WHERE s.shardid = "
        "get_shard_id_for_distribution_column('idempotency_key'::regclass, $1::text)",
        merchant_id,
    )[0]
    return int(row["shardid"]), int(row["nodeport"])


def test_moving_a_merchants_shard_loses_and_doubles_nothing(
    citus_db: Backend, citus: CitusCluster
) -> None:
    dsn = citus.coordinator_dsn(citus_db)
    # A loaded machine: a create waits for its 0210 up to 10 s before answering 202 (a new
    # connection's first delegated calls warm the worker's Citus metadata: about a second
    # each here under load), so the statuses below are the move's, not a slow start's.
    server = citus_db.server(
        IDEMPAY_DB_TIMEOUT="30", IDEMPAY_DB_POOL_SIZE="12", IDEMPAY_ANSWER_WITHIN="10"
    )
    api = Api(server.url, citus_db.api_key("moving"))
    merchant_id = query(dsn, "SELECT id FROM merchant WHERE name = 'moving'")[0][0]
    shard, source = placement(dsn, merchant_id)
    target = next(w.port for w in citus.workers if w.port != source)
    # one merchant, several terminals: a fleet keyed by terminal, one merchant id each
    fleet = Fleet({f"{merchant_id}#{n}": api for n in range(TERMINALS)}).start()
    moved = threading.Event()
    try:
        time.sleep(2.0)
        fleet.phase = "moving"
        execute_sync(
            dsn,
            "SELECT citus_move_shard_placement($1, '127.0.0.1', $2, '127.0.0.1', $3, "
            "shard_transfer_mode => 'force_logical')",
            shard,
            source,
            target,
        )
        moved.set()
        fleet.phase = "after"
        time.sleep(2.0)
    finally:
        fleet.stop()
    assert moved.is_set()
    assert placement(dsn, merchant_id) == (shard, target)

    for phase in ("before", "moving", "after"):  # the run, for docs/scaling.md
        print(f"{phase}: {dict(fleet.statuses(set(fleet.merchants), phase))}")
    statuses = fleet.statuses(set(fleet.merchants))
    assert set(statuses) <= {201, 409, 503}, statuses
    held = [a.key for a in fleet.answers if a.status == 409]
    assert all(a.phase == "moving" for a in fleet.answers if a.status == 409)
    # a 409 here was a claim cut by its lock timeout: nothing was written under its key
    assert {key: api.lookup(key).status_code for key in held} == dict.fromkeys(held, 404)
    assert fleet.statuses(set(fleet.merchants), "moving")[201] > 0  # paid during the move
    assert fleet.statuses(set(fleet.merchants), "after")[201] > 0  # and on the new worker
    again = fleet.retry_unanswered()  # a 503 (the write block outlasting the pool wait)
    assert set(again.values()) <= {201}, again
    approved = [a.key for a in fleet.answers if a.status == 201] + list(again)
    report = invariants(citus_db.url, [merchant_id], approved)
    assert report.ok, (report.failed(), report.violations)
    assert report.transactions == len(approved) == len(set(approved))
    charges = citus_db.sql(
        "SELECT count(*) FROM ledger_entry WHERE merchant_id = :m AND kind = 'charge'",
        m=merchant_id,
    )
    assert charges[0][0] == len(approved)
