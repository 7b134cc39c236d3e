"""A primary demoted under the server (a Patroni failover or switchover: the node we still
reach is read-only now) is an outage, not a bug: 503 service_unavailable, nothing
processed — the claim, the create's first write, is refused, so no 0200 leaves — and a retry
with the same key once a writable primary is back is processed once, with the key's one 0200.
The make failover run saw 500s here (asyncpg errors on the one-write path, since removed)."""

from __future__ import annotations

import pytest

from api.acquirer.host.store import summary
from idempay_tools.private_services import admin_sql
from tests.support.backend import Backend
from tests.support.client import Api, assert_problem, body, card, new_key


def _read_only(backend: Backend, on: bool) -> None:
    """Flip the database's sessions to read-only (or back) and end the open ones, as a
    demotion does: the server's pool reconnects to a node that refuses writes."""
    database = (backend.database_url or "").rsplit("/", 1)[1]
    setting = (
        "SET default_transaction_read_only = on" if on else "RESET default_transaction_read_only"
    )
    admin_sql(f'ALTER DATABASE "{database}" {setting}')
    admin_sql(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        f"WHERE datname = '{database}' AND pid <> pg_backend_pid()"
    )


@pytest.mark.parametrize("token", ["tok_visa_4242", "tok_issuer_slow"], ids=["at-once", "slow"])
def test_a_read_only_primary_is_503_and_the_retry_is_processed_once(
    private_pg_backend: Backend, token: str
) -> None:
    backend = private_pg_backend
    api_key = backend.api_key("merchant-ro")
    key, payload = new_key(), body(card=card(token))
    server = backend.server(IDEMPAY_COMPLETER_ENABLED="false", IDEMPAY_DB_TIMEOUT="2.0")
    api = Api(server.url, api_key)
    try:
        assert api.create(new_key()).status_code == 201  # warm: the pool is open
        _read_only(backend, True)
        refused = [api.create(key, payload) for _ in range(3)]  # first may meet a dead socket
        for response in refused:
            problem = assert_problem(response, 503, "service_unavailable")
            assert response.headers.get("retry-after"), problem
        assert backend.sql('SELECT count(*) FROM "transaction" WHERE id = :k', k=key)[0][0] == 0
        _read_only(backend, False)
        retried = [api.create(key, payload) for _ in range(3)]
    finally:
        server.stop()
        _read_only(backend, False)
    statuses = [r.status_code for r in retried]
    assert 201 in statuses and set(statuses) <= {201, 503}, statuses
    assert backend.sql('SELECT count(*) FROM "transaction" WHERE id = :k', k=key)[0][0] == 1
    charges = "SELECT count(*) FROM ledger_entry WHERE transaction_id = :k AND kind = 'charge'"
    assert backend.sql(charges, k=key)[0][0] == 1
    rrn = backend.sql('SELECT rrn FROM "transaction" WHERE id = :k', k=key)[0][0]
    acquirer = summary(backend.tmp / "var" / "acquirer.sqlite3")[rrn]
    assert (acquirer.requests, acquirer.approved) == (1, True)  # the 503s sent nothing
