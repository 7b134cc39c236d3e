"""Request events on Citus (issue 18): every request's event lands, each merchant's in
statements routed to its own shard, and a worker down holds back only its merchants' events.

The event writer (``api/events/writer.py``) splits a batch by merchant on Citus: one
``INSERT … VALUES`` per merchant (chunks of 64, 32, …, 1 rows), each routed to that
merchant's shard. A server on the coordinator serves merchants spread over both workers;
every request's event must reach ``request_event`` (one per request, contract §5), the
writer's statements must each be routed by a merchant (``citus_stat_statements``), and while
one worker is stopped the other worker's merchants' events still land, the stopped one's
wait in the queue and land once it is back — none lost, none doubled. (One
``INSERT … SELECT FROM unnest`` per batch, the plain-Postgres statement, is pulled to the
coordinator and written to every merchant's shard in one distributed transaction: with one
worker down no merchant's events would land.)
"""

from __future__ import annotations

from collections import Counter

from api.events.writer import CITUS_INSERTS, COLUMNS, by_merchant
from tests.support.backend import Backend
from tests.support.citus import (
    CitusCluster,
    execute_sync,
    first_worker_down,
    query,
    spread_merchants,
    wait_until,
)
from tests.support.client import new_key

PER_WORKER = 2
MERCHANT = COLUMNS.index("merchant_id")


def _landed(dsn: str, merchants: set[str]) -> Counter[str]:
    """Events stored per merchant, one routed query each (the others' shards may be down)."""
    landed: Counter[str] = Counter()
    for merchant_id in sorted(merchants):
        rows, distinct = query(
            dsn,
            "SELECT count(*), count(DISTINCT event_id) FROM request_event WHERE merchant_id = $1",
            merchant_id,
        )[0]
        assert rows == distinct, (merchant_id, rows, distinct)  # no event written twice
        if rows:
            landed[merchant_id] = int(rows)
    return landed


def test_request_events_land_by_merchant_and_a_dead_worker_holds_back_only_its_own(
    citus_db: Backend, citus: CitusCluster
) -> None:
    dsn = citus.coordinator_dsn(citus_db)
    server = citus_db.server(IDEMPAY_DB_TIMEOUT="5", IDEMPAY_COMPLETER_ENABLED="false")
    placed = spread_merchants(
        citus_db, server.url, dsn, name="events", table="request_event", per_worker=PER_WORKER
    )
    victim_port, on_victim, elsewhere, apis = first_worker_down(placed)
    victim = citus.node_of_port(victim_port)
    execute_sync(dsn, "SELECT citus_stat_statements_reset()")

    # every request is one event: creates, a replay, a lookup, an abort
    made: Counter[str] = Counter()
    for merchant_id, api in apis.items():
        keys = [new_key() for _ in range(3)]
        for key in keys:
            assert api.create(key).status_code == 201
        assert api.create(keys[0]).status_code == 201  # replay
        assert api.lookup(keys[1]).status_code == 200
        assert api.abort(new_key()).status_code == 200
        made[merchant_id] += 6
    wait_until(lambda: _landed(dsn, set(apis)) == made, "every request's event", timeout=30)
    outcomes = Counter(
        row[0]
        for row in query(
            dsn,
            "SELECT outcome FROM request_event WHERE merchant_id = ANY($1::varchar[])",
            sorted(apis),
        )
    )
    assert outcomes == Counter(
        {"created": 3 * len(apis), "replayed": len(apis), "found": len(apis), "aborted": len(apis)}
    ), outcomes

    # the writer's statements: each routed by one merchant, none pulled to the coordinator
    writes = query(
        dsn,
        "SELECT partition_key, executor, calls FROM citus_stat_statements "
        "WHERE query LIKE 'INSERT INTO request_event%' AND dbid = "
        "(SELECT oid FROM pg_database WHERE datname = current_database())",
    )
    assert writes, "no request_event insert seen"
    assert {row["partition_key"] for row in writes} <= set(apis), writes
    assert {row["executor"] for row in writes} == {"adaptive"}, writes

    # one worker down: the others' events land meanwhile, its own wait, then land
    victim.kill()
    try:
        for merchant_id, api in apis.items():
            for _ in range(2):
                status = api.create(new_key()).status_code
                assert status == (503 if merchant_id in on_victim else 201), (merchant_id, status)
                made[merchant_id] += 1
        expected_elsewhere = Counter({m: made[m] for m in elsewhere})
        wait_until(
            lambda: _landed(dsn, elsewhere) == expected_elsewhere,
            "the live worker's merchants' events while the other worker is down",
            timeout=30,
        )
    finally:
        victim.start()
    wait_until(
        lambda: query(dsn, "SELECT count(*) FROM request_event")[0][0] >= 0,
        "the coordinator to reach the restarted worker",
    )
    execute_sync(dsn, "SELECT recover_prepared_transactions()")
    wait_until(lambda: _landed(dsn, set(apis)) == made, "every event after the restart", timeout=60)
    errors = query(
        dsn,
        "SELECT merchant_id, count(*) FROM request_event WHERE http_status = 503 "
        "AND merchant_id = ANY($1::varchar[]) GROUP BY merchant_id",
        sorted(apis),
    )
    assert {row[0]: row[1] for row in errors} == dict.fromkeys(on_victim, 2), errors


def test_a_batch_splits_into_one_merchants_chunks_of_known_sizes() -> None:
    """The writer's Citus statements: every row once, in its merchant's order, each chunk
    one merchant's rows and one of the seven prepared sizes (no cluster needed)."""
    counts = {"m-a": 1, "m-b": 3, "m-c": 77, "m-d": 130, "m-e": 64}
    rows = [(f"{m}-{n:03d}", None, m) for m, count in counts.items() for n in range(count)]
    rows = rows[::2] + rows[1::2]  # merchants interleaved, as a queue holds them
    chunks = by_merchant(rows)
    assert all(len(chunk) in CITUS_INSERTS for chunk in chunks)
    assert all(len({row[MERCHANT] for row in chunk}) == 1 for chunk in chunks)
    flat = [row for chunk in chunks for row in chunk]
    assert sorted(flat) == sorted(rows)
    for merchant in counts:
        assert [r for r in flat if r[MERCHANT] == merchant] == [
            r for r in rows if r[MERCHANT] == merchant
        ]
    assert [len(c) for c in chunks if c[0][MERCHANT] == "m-d"] == [64, 64, 2]
    assert [len(c) for c in chunks if c[0][MERCHANT] == "m-c"] == [64, 8, 4, 1]
