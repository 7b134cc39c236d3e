"""Every statement of the hot path is a single-shard one on Citus (issue 18).

A server on the Citus coordinator serves one merchant's creates (approved, declined, one
whose acquirer answers late), replay, conflicting body, lookup, reversal, aborts and an
expired create. The coordinator logs every statement its clients run, with parameters
(``log_statement = all`` for this database); each one the server ran is then EXPLAINed with
its own parameters (``PREPARE`` + ``EXPLAIN EXECUTE``): a statement on distributed tables
must plan to one task on one worker — no multi-shard plan. ``citus_stat_statements`` says
the same from the executor's side: a router query carries its merchant as
``partition_key``.

What is not single-shard by design stays off the request path: the completer's scan, the
relay, retention, the export (tests/citus/test_off_path.py), and the reversal-advice worker's
scan of its queue (the due advices, the depth for the metrics). This server runs neither
the completer nor the advice worker.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest

from tests.support.backend import Backend
from tests.support.citus import (
    CitusCluster,
    LoggedStatement,
    execute_sync,
    explain,
    logged_statements,
    query,
)
from tests.support.client import Api, body, card, new_key

REFERENCE_ONLY = re.compile(r"\b(api_key|merchant|database_epoch)\b")
QUERY = re.compile(r"\s*(SELECT|INSERT|UPDATE|DELETE|WITH)\b", re.I)
# the distributed tables, and the create's delegated calls (api/transactions/delegated.py)
DISTRIBUTED_TABLE = re.compile(
    r"\b(idempotency_key|transaction|ledger_entry|outbox_event|"
    r"merchant_outbox_seq|request_event)\b|\bidempay_(claim|finish)\("
)
DELEGATED_CALL = re.compile(r"\s*SELECT idempay_(claim|finish)\(")


@dataclass
class Plan:
    statement: LoggedStatement
    text: str

    @property
    def task_counts(self) -> list[int]:
        return [int(n) for n in re.findall(r"Task Count: (\d+)", self.text)]

    def workers(self, coordinator_port: int) -> set[int]:
        ports = {int(p) for p in re.findall(r"Node: host=\S+ port=(\d+)", self.text)}
        return ports - {coordinator_port}

    def single_shard(self, coordinator_port: int) -> bool:
        """A Citus plan of tasks, each one task, on one worker. A plan that shows no task
        at all (an insert-select pulled to the coordinator, whose shards are only known as
        its rows arrive) is not one."""
        return (
            "Custom Scan (Citus" in self.text
            and bool(self.task_counts)
            and all(n == 1 for n in self.task_counts)
            and len(self.workers(coordinator_port)) <= 1
        )


def drive_hot_path(api: Api) -> int:
    """Every kind of hot-path request, for one merchant; how many requests were made."""
    made = 0

    def count(response_status: int, expected: int) -> None:
        nonlocal made
        made += 1
        assert response_status == expected

    key = new_key()
    count(api.create(key).status_code, 201)  # claim, 0200, finish
    count(api.create(key).status_code, 201)  # its replay
    count(api.create(key, body(amount=1)).status_code, 422)  # another body
    count(api.lookup(key).status_code, 200)
    count(api.reverse(key).status_code, 200)
    count(api.lookup(key).status_code, 200)
    count(api.abort(new_key()).status_code, 200)  # fence a key never seen
    count(api.abort(key).status_code, 200)  # an abort after the fact
    declined = body(card=card("tok_decline_insufficient_funds"))
    count(api.create(new_key(), declined).status_code, 201)
    slow = new_key()  # the acquirer answers late: the 0200 outlasts a quick claim
    count(api.create(slow, body(card=card("tok_issuer_slow"))).status_code, 201)
    count(api.lookup(slow).status_code, 200)
    old = (datetime.now(UTC) - timedelta(days=400)).isoformat()
    count(api.create(new_key(), body(captured_at=old)).status_code, 410)  # fenced expired
    count(api.lookup(new_key()).status_code, 404)
    return made


@pytest.fixture(scope="module")
def hot_path(citus_db: Backend, citus: CitusCluster) -> tuple[list[Plan], list[dict[str, object]]]:
    database = citus_db.url.rsplit("/", 1)[1]
    coordinator = citus.coordinator.dsn(database)
    execute_sync(coordinator, f"ALTER DATABASE \"{database}\" SET log_statement = 'all'")
    server = citus_db.server(
        IDEMPAY_COMPLETER_ENABLED="false",
        IDEMPAY_ADVICE_ENABLED="false",
        IDEMPAY_PURGE_INTERVAL="86400",
        # a loaded machine: every create is answered in its request (201), never 202
        IDEMPAY_ANSWER_WITHIN="10",
        IDEMPAY_ACQUIRER_TIMEOUT="15",
    )
    api = Api(server.url, citus_db.api_key("single-shard"))
    merchant = query(coordinator, "SELECT id FROM merchant WHERE name = 'single-shard'")[0][0]
    execute_sync(coordinator, "SELECT citus_stat_statements_reset()")
    since = time.time()
    made = drive_hot_path(api)

    def flushed() -> bool:
        rows = query(
            coordinator, "SELECT count(*) FROM request_event WHERE merchant_id = $1", merchant
        )
        return bool(rows[0][0] >= made)

    deadline = time.monotonic() + 10
    while not flushed() and time.monotonic() < deadline:
        time.sleep(0.1)
    server.stop()
    statements = logged_statements(citus.coordinator, database, since=since)
    on_shards = [s for s in statements if QUERY.match(s.sql) and DISTRIBUTED_TABLE.search(s.sql)]
    plans = [Plan(s, explain(coordinator, s)) for s in on_shards]
    stats = [
        dict(r)
        for r in query(
            coordinator,
            "SELECT partition_key, executor, calls, query FROM citus_stat_statements "
            "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())",
        )
    ]
    return plans, stats


def test_every_hot_path_statement_plans_to_one_shard(
    hot_path: tuple[list[Plan], list[dict[str, object]]], citus: CitusCluster
) -> None:
    plans, _ = hot_path
    seen = " ".join(p.statement.sql for p in plans)
    tables = [
        "idempotency_key",
        "transaction",
        "ledger_entry",
        "outbox_event",
        "request_event",
        "idempay_claim(",  # the create's claim and finish: one delegated call each
        "idempay_finish(",
    ]
    for table in tables:
        assert table in seen, f"no hot-path statement on {table} was seen: {seen[:500]}"
    port = citus.coordinator.port
    multi = [p for p in plans if not p.single_shard(port)]
    assert not multi, "\n\n".join(f"{p.statement.sql}\n{p.text}" for p in multi)


def test_the_executor_routes_each_by_its_merchant(
    hot_path: tuple[list[Plan], list[dict[str, object]]],
) -> None:
    """citus_stat_statements: a router query records its shard's key (the merchant). The
    create's claim and finish are statements of one merchant each, and so are the event
    writer's: every statement on a distributed table is routed."""
    _, stats = hot_path
    unrouted = [
        s
        for s in stats
        if s["partition_key"] is None
        and DISTRIBUTED_TABLE.search(str(s["query"]))
        # a delegated call records no key here: its plan is one task on the merchant's
        # worker (EXPLAINed above), where the function's own statements run
        and not DELEGATED_CALL.match(str(s["query"]))
    ]
    assert not unrouted, unrouted
    delegated = {
        str(s["query"]).split("(")[0].split()[-1]
        for s in stats
        if DELEGATED_CALL.match(str(s["query"]))
    }
    assert delegated == {"idempay_claim", "idempay_finish"}, stats
    assert not [s for s in stats if str(s["query"]).lstrip().startswith("WITH k AS")]
