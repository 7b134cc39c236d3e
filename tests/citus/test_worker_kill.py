"""A Citus worker killed under a paying fleet (issue 18).

Merchants are spread over both workers; one worker is stopped at once (``pg_ctl -m
immediate``, as a crash) while every merchant's terminal pays, and started again a few
seconds later. While it is down, its merchants' creates are answered 503 — nothing processed,
the key free — and every other merchant is served as if nothing happened. After the restart
each key answered 503 is sent again with the same key and gets its real outcome, and contract
§8 holds for everyone: no key charged twice, no charge without its transaction, the ledgers
balanced.
"""

from __future__ import annotations

import time

from tests.citus.fleet import Fleet, invariants
from tests.support.backend import Backend
from tests.support.citus import (
    CitusCluster,
    execute_sync,
    merchants_by_worker,
    query,
    wait_until,
)
from tests.support.client import Api

PER_WORKER = 3


def spread_merchants(backend: Backend, url: str, dsn: str) -> dict[int, dict[str, Api]]:
    """API keys for new merchants until each worker holds PER_WORKER of them."""
    placed: dict[int, dict[str, Api]] = {}
    number = 0
    while len(placed) < 2 or min(len(m) for m in placed.values()) < PER_WORKER:
        name = f"kill-{number}"
        api = Api(url, backend.api_key(name))
        merchant_id = query(dsn, "SELECT id FROM merchant WHERE name = $1", name)[0][0]
        port = next(iter(merchants_by_worker(dsn, [merchant_id])))
        if len(placed.get(port, {})) < PER_WORKER:
            placed.setdefault(port, {})[merchant_id] = api
        number += 1
    return placed


def test_a_killed_worker_fails_only_its_merchants(citus_db: Backend, citus: CitusCluster) -> None:
    database = citus_db.url.rsplit("/", 1)[1]
    dsn = citus.coordinator.dsn(database)
    server = citus_db.server(IDEMPAY_DB_TIMEOUT="5", IDEMPAY_DB_POOL_SIZE="12")
    placed = spread_merchants(citus_db, server.url, dsn)
    victim_port = sorted(placed)[0]
    victim = citus.node_of_port(victim_port)
    on_victim = set(placed[victim_port])
    elsewhere = {m for port, ms in placed.items() if port != victim_port for m in ms}
    fleet = Fleet({m: api for ms in placed.values() for m, api in ms.items()}).start()
    try:
        time.sleep(2.0)
        victim.kill()
        killed_at = time.monotonic()
        fleet.phase = "down"
        time.sleep(4.0)
        fleet.phase = "restarting"
        victim.start()
        wait_until(  # the coordinator reaches it again
            lambda: query(dsn, "SELECT count(*) FROM idempotency_key")[0][0] >= 0,
            "the coordinator to reach the restarted worker",
        )
        fleet.phase = "after"
        time.sleep(2.0)
    finally:
        fleet.stop()
    execute_sync(dsn, "SELECT recover_prepared_transactions()")

    for phase in ("before", "down", "restarting", "after"):  # the run, for docs/scaling.md
        print(
            f"{phase}: victim's merchants {dict(fleet.statuses(on_victim, phase))}, "
            f"the others {dict(fleet.statuses(elsewhere, phase))}"
        )

    # everyone else was served all along; the victim's merchants got 503, nothing else
    assert set(fleet.statuses(elsewhere)) == {201}, fleet.statuses(elsewhere)
    assert fleet.statuses(elsewhere, "down")[201] > 0
    down = fleet.statuses(on_victim, "down")
    assert down[503] > 0 and set(down) <= {201, 503}, down
    assert set(fleet.statuses(on_victim)) <= {201, 503}, fleet.statuses(on_victim)
    assert fleet.statuses(on_victim, "after")[201] > 0

    # a 503 sent after the kill processed nothing: no transaction under its key
    refused = [a.key for a in fleet.answers if a.status == 503 and a.sent_at > killed_at + 0.5]
    assert refused
    held = citus_db.sql('SELECT count(*) FROM "transaction" WHERE id = ANY(:keys)', keys=refused)
    assert held[0][0] == 0

    # the same key again gets the real outcome, once
    again = fleet.retry_unanswered()
    assert set(again.values()) == {201}, again
    approved = [a.key for a in fleet.answers if a.status == 201] + list(again)
    report = invariants(citus_db.url, sorted(on_victim | elsewhere), approved)
    assert report.ok, (report.failed(), report.violations)
    assert report.transactions == len(approved)
    assert report.processing_keys == 0
