"""503 when storage is down (nothing processed, retry safe) and 429 per API key."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.support.backend import Backend
from tests.support.client import Api, assert_problem, body, new_key
from tests.support.forwarder import Forwarder
from tests.support.services import pg_url


@pytest.fixture
def cut_database(pg_backend: Backend) -> Iterator[tuple[Api, Forwarder]]:
    """A server whose Postgres connection runs through a forwarder we can cut."""
    forwarder = Forwarder("127.0.0.1", 5432).start()
    database = pg_backend.database_url.rsplit("/", 1)[1] if pg_backend.database_url else ""
    url = pg_url(database).replace("127.0.0.1:5432", f"127.0.0.1:{forwarder.port}")
    server = pg_backend.server(IDEMPAY_DATABASE_URL=url, IDEMPAY_DB_TIMEOUT="1.0")
    api = Api(server.url, pg_backend.api_key("merchant-503"))
    try:
        yield api, forwarder
    finally:
        server.stop()
        forwarder.stop()


def test_storage_down_is_503_and_a_retry_processes_once(
    cut_database: tuple[Api, Forwarder], pg_backend: Backend
) -> None:
    api, forwarder = cut_database
    assert api.create(new_key()).status_code == 201  # warm: auth cached, pool open
    key = new_key()
    forwarder.pause()
    try:
        down = api.create(key, body(amount=321))
        problem = assert_problem(down, 503, "service_unavailable")
        assert down.headers["retry-after"].isdigit()
        assert "nothing was processed" in problem["detail"].lower()
        with api.client() as client:
            ready = client.get("/readyz")
        assert ready.status_code == 503
        assert_problem(api.lookup(key), 503, "service_unavailable")
    finally:
        forwarder.resume()
    deadline = time.monotonic() + 20
    while (response := api.create(key, body(amount=321))).status_code == 503:
        assert time.monotonic() < deadline, "storage did not come back"
        time.sleep(0.2)
    assert response.status_code == 201
    assert response.headers["idempotency-status"] == "created"
    rows = pg_backend.sql(
        "SELECT count(*) FROM ledger_entry WHERE transaction_id = :k AND kind = 'charge'", k=key
    )
    assert rows[0][0] == 1


def test_burst_beyond_the_limit_is_429_and_other_keys_are_unaffected(
    pg_backend: Backend,
) -> None:
    # per minute: on a busy machine 12 requests may take longer than a second
    server = pg_backend.server(IDEMPAY_RATE_LIMIT="5/minute")
    try:
        noisy = Api(server.url, pg_backend.api_key("merchant-noisy"))
        calm = Api(server.url, pg_backend.api_key("merchant-calm"))
        key = new_key()
        answers = [noisy.create(key) for _ in range(12)]
        limited = [r for r in answers if r.status_code == 429]
        assert limited, [r.status_code for r in answers]
        for response in limited:
            assert_problem(response, 429, "rate_limited")
            assert int(response.headers["retry-after"]) >= 1
        assert {r.status_code for r in answers} <= {201, 429}
        assert calm.lookup(new_key()).status_code == 404  # a different API key: not limited
        assert calm.create(new_key()).status_code == 201
        rows = pg_backend.sql('SELECT count(*) FROM "transaction" WHERE id = :k', k=key)
        assert rows[0][0] == 1
    finally:
        server.stop()
