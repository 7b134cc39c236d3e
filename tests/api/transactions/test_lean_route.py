"""The lean routes (api/transactions/lean.py): they serve the create and the lookup, and
the OpenAPI document still describes the create with its headers."""

from __future__ import annotations

from api.config import Settings
from api.main import create_app
from api.transactions.lean import CreateRoute
from tests.support.backend import Backend
from tests.support.client import Api, assert_problem, new_key


def test_openapi_still_documents_the_create_and_its_headers() -> None:
    app = create_app(Settings(database_url="sqlite+aiosqlite:///:memory:"))
    assert any(m.cls is CreateRoute for m in app.user_middleware)
    create = app.openapi()["paths"]["/v1/transactions"]["post"]
    headers = {p["name"] for p in create["parameters"] if p["in"] == "header"}
    assert {"Idempotency-Key", "Idempotency-Attempt", "POS-Network"} <= headers


def test_the_lean_route_answers_like_the_contract(backend: Backend) -> None:
    server = backend.server()
    api = Api(server.url, backend.api_key("merchant-lean"))
    try:
        key = new_key()
        created = api.create(key, **{"POS-Network": "GPRS", "Idempotency-Attempt": "1"})
        assert created.status_code == 201 and created.headers["idempotency-status"] == "created"
        assert created.headers["x-request-id"]
        replayed = api.create(key)
        assert replayed.headers["idempotent-replayed"] == "true"
        assert replayed.content == created.content
        found = api.lookup(key)  # the lookup's lean route
        assert found.status_code == 200 and found.content == created.content
        assert found.headers["idempotency-status"] == "processed"
        assert_problem(api.lookup(new_key()), 404, "not_found")
        assert_problem(api.create(None), 400, "idempotency_key_missing")
        assert_problem(api.create(key, api_key="wrong"), 401, "unauthorized")
    finally:
        server.stop()
