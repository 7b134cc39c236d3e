"""Operations endpoints and what must never leak (contract §2 Operations; issue done-when 5)."""

from __future__ import annotations

import httpx

from tests.api.conftest import Deployment
from tests.support.backend import Backend
from tests.support.client import Api, body, card, new_key


def test_health_readiness_and_request_id(deployment: Deployment) -> None:
    with deployment.a.client() as client:
        health = client.get("/healthz")
        ready = client.get("/readyz")
        echoed = client.get("/healthz", headers={"X-Request-Id": "pos-42.retry_1"})
        unsafe = client.get("/healthz", headers={"X-Request-Id": "a b\tc"})
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    assert ready.status_code == 200 and ready.json()["checks"]["database"] == "ok"
    assert ready.json()["checks"]["redis"] == "disabled"
    assert health.headers["x-request-id"] != ready.headers["x-request-id"]
    assert echoed.headers["x-request-id"] == "pos-42.retry_1"
    assert unsafe.headers["x-request-id"] != "a b\tc"


def test_metrics_count_requests_replays_and_conflicts(deployment: Deployment) -> None:
    key = new_key()
    deployment.a.create(key)
    deployment.a.create(key)
    deployment.a.create(key, body(amount=2))
    with deployment.a.client() as client:
        text = client.get("/metrics").text
    assert 'idempay_requests_total{endpoint="create",outcome="created"}' in text
    assert 'idempay_requests_total{endpoint="create",outcome="replayed"}' in text
    assert 'idempay_requests_total{endpoint="create",outcome="key_reused"}' in text
    assert "idempay_request_latency_seconds_bucket" in text
    assert "idempay_replays_total" in text and "idempay_conflicts_total" in text
    assert "idempay_in_flight_keys" in text and "idempay_recoveries_total" in text
    assert key not in text


def test_idempotency_policy_publishes_the_windows(deployment: Deployment) -> None:
    with httpx.Client(base_url=deployment.a.base_url) as client:
        policy = client.get("/v1/idempotency-policy").json()
    assert policy["completed_keys"]["retention"] == "permanent"
    assert policy["tombstone_retention_seconds"] == 35 * 86400
    assert policy["captured_at_max_age_seconds"] == policy["tombstone_retention_seconds"]
    assert policy["request_event_retention_seconds"] == policy["tombstone_retention_seconds"]
    assert policy["key_scope"] == "merchant"


def test_openapi_and_docs_are_served(deployment: Deployment) -> None:
    with httpx.Client(base_url=deployment.a.base_url) as client:
        spec = client.get("/openapi.json").json()
        docs = client.get("/docs")
    assert "/v1/transactions" in spec["paths"]
    assert "TransactionCreate" in spec["components"]["schemas"]
    assert docs.status_code == 200


def test_no_api_key_card_token_or_pan_reaches_logs_or_storage(pg_backend: Backend) -> None:
    server = pg_backend.server(IDEMPAY_LOG_LEVEL="DEBUG")
    api_key = pg_backend.api_key("merchant-secrets")
    api = Api(server.url, api_key)
    token = "tok_secret_marker_5150"
    pan = "4111111111111111"
    key = new_key()
    assert api.create(key, body(card=card(token))).status_code == 201
    assert api.create(new_key(), body(metadata={"card": pan})).status_code == 422
    assert api.create(new_key(), body(card=card(f"tok_{pan}"))).status_code == 422
    wrong = "idp_this_is_not_a_real_key_but_is_secret"
    assert Api(server.url, wrong).create(new_key()).status_code == 401
    api.lookup(key)
    api.reverse(key)
    server.stop()  # flush everything to the log file
    log = server.log_path.read_text()
    assert '"status": 201' in log  # the log is the real request log
    for secret in (api_key, wrong, token, pan):
        assert secret not in log
    stored = pg_backend.sql("SELECT key_hash, prefix FROM api_key")
    assert all(api_key not in (row[0], row[1]) for row in stored)
    assert not pg_backend.sql(
        "SELECT 1 FROM request_event WHERE idempotency_key IS NULL OR merchant_id IS NULL"
    )
    dumped = " ".join(
        str(row)
        for table in ("transaction", "ledger_entry", "request_event", "idempotency_key")
        for row in pg_backend.sql(f'SELECT * FROM "{table}"')
        if table != "idempotency_key" or row[2] != "processing"
    )
    assert pan not in dumped
    assert token not in dumped  # completed keys drop the request copy they kept for re-drive
