"""The OpenAPI document explains itself to a newcomer (contract §2: "OpenAPI at
/openapi.json, docs at /docs"): it is valid OpenAPI 3.1 by a maintained validator
(openapi-spec-validator); every operation that answers 401 without an API key declares the
bearer scheme (so /docs has an Authorize button) and no other does; the create's
`Idempotency-Key` is required, a UUID, and described, as are `Idempotency-Attempt`,
`POS-Network` and `Prefer`; `amount` says it is integer minor units and the request body
carries examples the server accepts; the by-id path parameter is described; and no
description leaks how the server is built (module paths, function or class names).

The document is read from the real app (lifespan running, embedded SQLite) over ASGI, and
each claim it makes about authentication and the required key is checked against the
app's answers."""

from __future__ import annotations

import importlib
import inspect
import json
import pkgutil
import re
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import pytest
from fastapi import FastAPI
from openapi_spec_validator import OpenAPIV31SpecValidator, validate

import api.transactions
from api.auth import create_api_key
from api.config import Settings
from api.errors import TITLES
from tests.support import asgi
from tests.support.asgi import migrated_sqlite
from tests.support.backend import Backend
from tests.support.chromium import FLAGS, ensure_chromium

CREATE = ("/v1/transactions", "post")
BY_ID = {
    ("/v1/transactions/{transaction_id}", "get"),
    ("/v1/transactions/{transaction_id}/abort", "post"),
    ("/v1/transactions/{transaction_id}/reversal", "post"),
}
# The operations contract §2 puts behind an API key.
AUTHENTICATED = {CREATE, ("/v1/transactions", "get"), *BY_ID}
METHODS = {"get", "post", "put", "patch", "delete"}

app, http = asgi.app, asgi.http  # the fixtures, on asgi_settings


@pytest.fixture(scope="module")
def asgi_settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    return migrated_sqlite(tmp_path_factory.mktemp("openapi") / "var")


@pytest.fixture(scope="module")
async def api_key(app: FastAPI) -> str:
    return await create_api_key(app.state.ctx.engine, "openapi-merchant")


@pytest.fixture(scope="module")
async def document(http: httpx.AsyncClient) -> dict[str, Any]:
    response = await http.get("/openapi.json")
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


def _operations(document: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in document["paths"].items():
        for method, operation in item.items():
            if method in METHODS:
                yield path, method, operation


def _parameter(operation: dict[str, Any], name: str, where: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [
        p for p in operation.get("parameters", []) if (p["name"], p["in"]) == (name, where)
    ]
    assert len(found) == 1, (name, where, operation.get("parameters"))
    return found[0]


def _texts(node: Any) -> Iterator[str]:
    """Every description and summary in the document, at any depth."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("description", "summary") and isinstance(value, str):
                yield value
            else:
                yield from _texts(value)
    elif isinstance(node, list):
        for value in node:
            yield from _texts(value)


def _schema_validator(document: dict[str, Any], name: str) -> jsonschema.Draft202012Validator:
    root = {"$ref": f"#/components/schemas/{name}", "components": document["components"]}
    return jsonschema.Draft202012Validator(
        root, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )


def test_the_document_is_valid_openapi_3_1(document: dict[str, Any]) -> None:
    assert document["openapi"].startswith("3.1.")
    validate(document)  # picks the validator by the document's version
    errors = [error.message for error in OpenAPIV31SpecValidator(document).iter_errors()]
    assert errors == []


async def test_the_bearer_scheme_is_declared_on_every_operation_that_needs_a_key(
    document: dict[str, Any], http: httpx.AsyncClient
) -> None:
    """Asked without an API key, an operation answers 401 exactly when the document says
    it needs the bearer scheme; the scheme is HTTP bearer (Swagger UI's Authorize button)."""
    schemes = document["components"]["securitySchemes"]
    assert len(schemes) == 1
    [(name, scheme)] = schemes.items()
    assert scheme["type"] == "http" and scheme["scheme"].lower() == "bearer"
    assert "Authorization: Bearer" in scheme["description"]

    refused: set[tuple[str, str]] = set()
    for path, method, operation in _operations(document):
        url = path.replace("{transaction_id}", str(uuid.uuid4()))
        params = (
            {"since": "2026-11-20T00:00:00Z"}
            if (path, method) == ("/v1/transactions", "get")
            else None
        )
        headers = {"Idempotency-Key": str(uuid.uuid4())} if (path, method) == CREATE else {}
        response = await http.request(
            method.upper(),
            url,
            params=params,
            headers=headers,
            json={} if method == "post" else None,
        )
        declared = operation.get("security", document.get("security", []))
        if response.status_code == 401:
            refused.add((path, method))
            assert response.json()["code"] == "unauthorized"
            assert declared == [{name: []}], (path, method, declared)
            assert "401" in operation["responses"], (path, method)
        else:
            assert declared in ([], [{}]), (path, method, response.status_code, declared)
    assert refused == AUTHENTICATED


async def test_the_idempotency_key_is_required_a_uuid_and_described(
    document: dict[str, Any], http: httpx.AsyncClient, api_key: str
) -> None:
    create = document["paths"][CREATE[0]][CREATE[1]]
    key = _parameter(create, "Idempotency-Key", "header")
    assert key["required"] is True
    assert key["schema"]["type"] == "string" and key["schema"].get("format", "uuid") == "uuid"
    assert "UUID" in key["description"] and "same key" in key["description"]
    uuid.UUID(key["example"])
    # ... as the server has it: no key is 400 idempotency_key_missing, a non-UUID 400 invalid
    auth = {"Authorization": f"Bearer {api_key}"}
    example = create["requestBody"]["content"]["application/json"]["examples"]["purchase"]
    missing = await http.post("/v1/transactions", json=example["value"], headers=auth)
    assert (missing.status_code, missing.json()["code"]) == (400, "idempotency_key_missing")
    invalid = await http.post(
        "/v1/transactions", json=example["value"], headers={**auth, "Idempotency-Key": "abc"}
    )
    assert (invalid.status_code, invalid.json()["code"]) == (400, "idempotency_key_invalid")


def test_the_optional_headers_are_described(document: dict[str, Any]) -> None:
    create = document["paths"][CREATE[0]][CREATE[1]]
    attempt = _parameter(create, "Idempotency-Attempt", "header")
    network = _parameter(create, "POS-Network", "header")
    assert attempt["required"] is False and "attempt number" in attempt["description"]
    assert network["required"] is False
    for link in ("gprs", "3g", "4g", "wifi", "ethernet", "other"):
        assert f"`{link}`" in network["description"], link
    # Prefer: wait=N where contract §2.8 allows it (create, lookup, abort), not on reversal
    for path, method in {CREATE, *BY_ID}:
        operation = document["paths"][path][method]
        names = {(p["name"], p["in"]) for p in operation.get("parameters", [])}
        if path.endswith("/reversal"):
            assert ("Prefer", "header") not in names
            continue
        prefer = _parameter(operation, "Prefer", "header")
        assert prefer["required"] is False and "wait=N" in prefer["description"]


async def test_amount_is_minor_units_and_the_body_examples_are_accepted(
    document: dict[str, Any], http: httpx.AsyncClient, api_key: str
) -> None:
    """Each documented request body is valid by the document's own schema, and the server
    processes it (201): an example a newcomer sends from /docs works."""
    schemas = document["components"]["schemas"]
    for name in ("TransactionCreate", "TransactionOut"):
        amount = schemas[name]["properties"]["amount"]
        assert amount["type"] == "integer"
        assert "minor units" in amount["description"], name
        assert amount["examples"] and all(isinstance(x, int) for x in amount["examples"])
    bounds = schemas["TransactionCreate"]["properties"]["amount"]
    assert (bounds["minimum"], bounds["maximum"]) == (1, 10**12)
    assert all(1 <= x <= 10**12 for x in bounds["examples"])

    body = document["paths"][CREATE[0]][CREATE[1]]["requestBody"]
    assert body["required"] is True and "minor units" in body["description"]
    examples = body["content"]["application/json"]["examples"]
    assert len(examples) >= 2
    validator = _schema_validator(document, "TransactionCreate")
    answers = _schema_validator(document, "TransactionOut")
    auth = {"Authorization": f"Bearer {api_key}"}
    for name, example in examples.items():
        assert example["summary"], name
        errors = [error.message for error in validator.iter_errors(example["value"])]
        assert errors == [], (name, errors)
        headers = {**auth, "Idempotency-Key": str(uuid.uuid4())}
        response = await http.post("/v1/transactions", json=example["value"], headers=headers)
        assert response.status_code == 201, (name, response.text)
        assert list(answers.iter_errors(response.json())) == [], name
        assert response.json()["amount"] == example["value"]["amount"]


def test_the_path_parameter_is_described(document: dict[str, Any]) -> None:
    for path, method in BY_ID:
        parameter = _parameter(document["paths"][path][method], "transaction_id", "path")
        assert parameter["required"] is True
        assert "Idempotency-Key" in parameter["description"], path
        assert parameter["schema"]["format"] == "uuid", path


def _internal_names(vocabulary: set[str]) -> set[str]:
    """Functions and classes of the modules that build the HTTP API, as a reader of the
    code would spell them (snake_case with an underscore, or CamelCase); a name that is also
    API vocabulary (a problem code, a field or parameter) is not internal."""
    modules = ["api.main", "api.ops", "api.docs_page", "api.errors", "api.auth"] + [
        info.name for info in pkgutil.iter_modules(api.transactions.__path__, "api.transactions.")
    ]
    names: set[str] = set()
    for module_name in modules:
        module = importlib.import_module(module_name)
        for name, value in vars(module).items():
            if not (inspect.isfunction(value) or inspect.isclass(value)):
                continue
            if getattr(value, "__module__", None) != module_name:
                continue
            name = name.lstrip("_")
            if "_" in name or re.search(r"[a-z][A-Z]", name):
                names.add(name)
    return names - vocabulary


def test_no_description_leaks_how_the_server_is_built(document: dict[str, Any]) -> None:
    texts = list(_texts(document))
    assert document["info"]["description"] in texts
    schemas = document["components"]["schemas"]
    vocabulary = set(TITLES) | set(schemas)
    for schema in schemas.values():
        vocabulary |= set(schema.get("properties", {}))
    for _path, _method, operation in _operations(document):
        vocabulary |= {p["name"] for p in operation.get("parameters", [])}
    internal = _internal_names(vocabulary)
    assert {"handle_create", "CreateRoute", "handle_lookup"} <= internal
    leaks = []
    for text in texts:
        if re.search(r"\.py\b|\b(?:api|client_sdk|idempay_tools|tests)/|\bapi\.\w", text):
            leaks.append(("module", text))
        for name in internal:
            if re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text):
                leaks.append((name, text))
    assert leaks == []
    # operation ids and summaries read as API words, not Python function names
    for path, method, operation in _operations(document):
        assert operation["summary"][:1].isupper(), (path, method)
        assert operation["operationId"].isidentifier() and "_" not in operation["operationId"]


@pytest.fixture(scope="module")
def chromium() -> str:
    return ensure_chromium()


def test_the_docs_page_offers_authorize(chromium: str, sqlite_backend: Backend) -> None:
    """Swagger UI at /docs renders its Authorize button (it shows one only for a document
    that declares a security scheme)."""
    server = sqlite_backend.server()
    try:
        dom = subprocess.run(
            [chromium, *FLAGS, "--virtual-time-budget=10000", server.url + "/docs"],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout
        served = json.loads(httpx.get(server.url + "/openapi.json", timeout=10).text)
    finally:
        server.stop()
    assert "opblock" in dom, dom[-2000:]
    assert re.search(r'<button[^>]*class="[^"]*\bauthorize\b', dom), dom[-2000:]
    assert "bearerAuth" in served["components"]["securitySchemes"]
