"""Review finding A on a real server (its own completer loop, both backends): an offline
advice whose issuer never answers (``tok_issuer_down``) is still ``processing`` well past
``IDEMPAY_ISSUER_DEADLINE`` — lookups 202, a client's abort 409, nothing voided — while an
online key with the same card, on the same server, is voided and fenced at its deadline."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from tests.support.backend import Backend
from tests.support.client import Api, assert_problem, body, card, new_key


def test_an_advice_outlives_the_issuer_deadline_an_online_key_does_not(
    private_backend: Backend,
) -> None:
    server = private_backend.server(IDEMPAY_ISSUER_DEADLINE="3", IDEMPAY_LEASE_SECONDS="1")
    api = Api(server.url, private_backend.api_key("merchant-a"))
    captured = (datetime.now(UTC) - timedelta(minutes=10)).isoformat()
    advice_key, online_key = new_key(), new_key()
    advice = body(card=card("tok_issuer_down"), entry_mode="offline", captured_at=captured)
    assert api.create(advice_key, advice).status_code == 202
    assert api.create(online_key, body(card=card("tok_issuer_down"))).status_code == 202
    deadline = time.monotonic() + 30
    while api.lookup(online_key).status_code != 410:  # the control: fenced at its deadline
        assert time.monotonic() < deadline, "the online key was never fenced"
        time.sleep(0.3)
    time.sleep(3)  # the advice: twice its deadline now, re-driven meanwhile
    looked = api.lookup(advice_key)
    assert looked.status_code == 202, looked.text
    assert looked.headers["idempotency-status"] == "in_progress"
    assert_problem(api.abort(advice_key), 409, "request_in_progress")
    [(state,)] = private_backend.sql(
        "SELECT state FROM idempotency_key WHERE key = :k", k=advice_key
    )
    assert state == "processing"
    voided = private_backend.sql(
        "SELECT count(*) FROM issuer_authorization WHERE result = 'voided'"
    )
    assert voided[0][0] == 1  # the online key's only
