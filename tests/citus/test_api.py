"""The API contract on Citus (issue 18): a server whose IDEMPAY_DATABASE_URL is the Citus
coordinator answers contract §2 as on one Postgres, twenty concurrent duplicates of a key
execute once, and a fleet run through the SDK on a lossy link holds contract §8."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import aiohttp
import pytest

from tests.support.backend import Backend
from tests.support.citus import CitusCluster, query
from tests.support.client import Api, assert_problem, body, card, new_key
from tests.support.services import ROOT, Server

KEYS = 10
DUPLICATES = 20


@pytest.fixture(scope="module")
def server(citus_db: Backend) -> Server:
    # A loaded machine: a create waits for its 0210 up to 10 s before answering 202, so the
    # statuses below are the contract's answers to duplicates, not to a slow acquirer.
    return citus_db.server(
        IDEMPAY_DB_TIMEOUT="60", IDEMPAY_ANSWER_WITHIN="10", IDEMPAY_ACQUIRER_TIMEOUT="15"
    )


@pytest.fixture(scope="module")
def api(citus_db: Backend, server: Server) -> Api:
    return Api(server.url, citus_db.api_key("citus-api-a"))


@pytest.fixture(scope="module")
def other(citus_db: Backend, server: Server) -> Api:
    return Api(server.url, citus_db.api_key("citus-api-b"))


def test_create_replay_lookup_reverse(api: Api, citus_db: Backend) -> None:
    key = new_key()
    created = api.create(key, body(amount=4321))
    assert created.status_code == 201, created.text
    assert created.json()["status"] == "approved"
    replay = api.create(key, body(amount=4321))
    assert replay.status_code == 201
    assert replay.headers["idempotent-replayed"] == "true"
    assert replay.content == created.content
    assert_problem(api.create(key, body(amount=1)), 422, "idempotency_key_reused")
    assert api.lookup(key).json()["status"] == "approved"
    assert api.reverse(key).json()["status"] == "reversed"
    assert api.lookup(key).json()["status"] == "reversed"
    kinds = citus_db.sql(
        "SELECT kind FROM ledger_entry WHERE transaction_id = :k ORDER BY kind", k=key
    )
    assert [row[0] for row in kinds] == ["charge", "reversal"]
    # by time: ids come from per-node sequence ranges on Citus (the completion's event is
    # inserted on the merchant's worker by the delegated finish), not in commit order
    events = citus_db.sql(
        "SELECT type FROM outbox_event WHERE transaction_id = :k ORDER BY created_at", k=key
    )
    assert [row[0] for row in events] == ["transaction.completed", "transaction.reversed"]


def test_abort_fences_and_declines_and_slow_issuers(api: Api) -> None:
    fenced = new_key()
    assert api.abort(fenced).json()["status"] == "aborted"
    assert_problem(api.create(fenced), 410, "transaction_aborted")
    declined = api.create(new_key(), body(card=card("tok_decline_do_not_honor")))
    assert declined.status_code == 201
    assert declined.json()["decline_reason"] == "do_not_honor"
    slow = new_key()  # claim, the 0200 with no transaction open, finish
    answered = api.create(slow, body(card=card("tok_issuer_slow")))
    assert answered.status_code == 201, answered.text
    assert api.lookup(slow).json()["status"] == "approved"


def test_merchants_do_not_see_each_other(api: Api, other: Api) -> None:
    key = new_key()
    assert api.create(key).status_code == 201
    assert_problem(other.lookup(key), 404, "not_found")
    assert other.create(key).status_code == 201  # the same key is another merchant's own
    assert api.lookup(key).json()["id"] == key


def test_the_listing_pages_by_created_at_on_citus(api: Api) -> None:
    """On Citus the listing pages by (created_at, id) (migration 0011 gives ``listing_pos``
    no default there): every transaction of a terminal, page after page, none twice."""
    terminal = f"T-LIST-{new_key()[:8]}"
    keys = [new_key() for _ in range(5)]
    for key in keys:
        assert api.create(key, body(terminal_id=terminal)).status_code == 201
    seen: list[str] = []
    params = {"terminal_id": terminal, "since": "2000-01-01T00:00:00Z", "limit": "2"}
    with api.client() as client:
        while True:
            page = client.get("/v1/transactions", params=params, headers=api.headers(None))
            assert page.status_code == 200, page.text
            seen += [txn["id"] for txn in page.json()["data"]]
            cursor = page.json()["next_cursor"]
            if cursor is None:
                break
            params["cursor"] = cursor
    assert sorted(seen) == sorted(keys)
    assert len(seen) == len(keys)


async def _duplicates(api: Api, keys: list[str]) -> list[tuple[str, int]]:
    connector = aiohttp.TCPConnector(limit=100)
    headers = {"Authorization": f"Bearer {api.api_key}"}
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(
        api.base_url, connector=connector, headers=headers, timeout=timeout
    ) as client:

        async def one(key: str) -> tuple[str, int]:
            async with client.post(
                "/v1/transactions",
                json=body(terminal_id="T-RACE", amount=500),
                headers={"Idempotency-Key": key},
            ) as response:
                await response.read()
                return key, response.status

        calls = [key for key in keys for _ in range(DUPLICATES)]
        return await asyncio.gather(*(one(key) for key in calls))


def test_twenty_concurrent_duplicates_execute_once(api: Api, citus_db: Backend) -> None:
    keys = [new_key() for _ in range(KEYS)]
    answers = asyncio.run(_duplicates(api, keys))
    statuses = Counter(status for _, status in answers)
    assert set(statuses) <= {201, 409}, statuses
    created = Counter(key for key, status in answers if status == 201)
    assert set(created) == set(keys)  # every key answered (the first, then replays)
    charges = citus_db.sql(
        "SELECT transaction_id, count(*) FROM ledger_entry WHERE kind = 'charge' "
        "AND transaction_id = ANY(:keys) GROUP BY transaction_id",
        keys=keys,
    )
    assert {row[0]: row[1] for row in charges} == {key: 1 for key in keys}
    transactions = citus_db.sql(
        'SELECT count(*) FROM "transaction" WHERE id = ANY(:keys)', keys=keys
    )
    assert transactions[0][0] == KEYS


def test_a_fleet_on_a_lossy_link_holds_every_invariant(
    citus_db: Backend, citus: CitusCluster, tmp_path: Path
) -> None:
    """``idempay simulate`` (its own server on the coordinator): terminals through the SDK,
    faults on the link, then contract §8 — no key charged twice, no charge without a
    transaction, nothing reported lost, the ledger balanced."""
    env = {
        **os.environ,
        "IDEMPAY_DATABASE_URL": citus_db.url,
        "IDEMPAY_VAR_DIR": str(tmp_path / "var"),
        "IDEMPAY_REDIS_URL": "",
        "COLUMNS": "120",
    }
    argv = [sys.executable, "-m", "idempay_tools", "simulate", "--workdir", str(tmp_path)]
    argv += ["--terminals", "4", "--payments", "15", "--loss", "0.1", "--seed", "18"]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "all invariants hold" in out, out
    assert not query(
        citus.coordinator.dsn(citus_db.url.rsplit("/", 1)[1]),
        "SELECT 1 FROM ledger_entry GROUP BY merchant_id, transaction_id, kind HAVING count(*) > 1",
    )
