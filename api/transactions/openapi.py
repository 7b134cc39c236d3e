"""OpenAPI documentation of the transaction routes (the body is parsed by hand so that auth,
size, JSON, PAN and schema checks run in that order; this file tells the schema)."""

from __future__ import annotations

from typing import Any

from api.transactions.schemas import KeyStateOut, Problem, TransactionCreate, TransactionOut

SCHEMA_MODELS = (TransactionCreate, TransactionOut, KeyStateOut, Problem)


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


CREATE_DOC: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": _ref("TransactionCreate")}},
    },
}
ID_DOC: dict[str, Any] = {}

_HEADERS = {
    "Idempotency-Status": {
        "description": "created | replayed | in_progress | processed | not_found | aborted | "
        "expired",
        "schema": {"type": "string"},
    },
    "X-Request-Id": {"schema": {"type": "string"}},
}


def _json(description: str, schema: str) -> dict[str, Any]:
    return {
        "description": description,
        "headers": _HEADERS,
        "content": {"application/json": {"schema": _ref(schema)}},
    }


def _problem(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "headers": _HEADERS,
        "content": {"application/problem+json": {"schema": _ref("Problem")}},
    }


_COMMON: dict[int | str, dict[str, Any]] = {
    400: _problem("idempotency_key_missing / idempotency_key_invalid"),
    401: _problem("unauthorized"),
    408: _problem("request_timeout: the body did not arrive in time; nothing was processed"),
    422: _problem("validation_error and friends"),
    429: _problem("rate_limited"),
    500: _problem("internal_error (never stored under the key)"),
    503: _problem("service_unavailable; nothing was processed"),
}

_BY_ENDPOINT: dict[str, dict[int | str, dict[str, Any]]] = {
    "create": {
        201: _json("Processed (approved/declined), or the identical replay", "TransactionOut"),
        202: _json("The issuer has not answered yet; the server finishes it", "KeyStateOut"),
        409: _problem(
            "request_in_progress / suspected_duplicate (the merchant's duplicate guard: "
            "duplicate_of names the earlier transaction; nothing was stored under the key)"
        ),
        410: _problem("transaction_aborted / request_expired"),
        413: _problem("payload_too_large"),
    },
    "lookup": {
        200: _json("Processed: use this result", "TransactionOut"),
        202: _json("In flight: look up again after Retry-After", "KeyStateOut"),
        404: _problem("not_found: nothing was processed under this key"),
        410: _problem("fenced: never processed and never will be"),
    },
    "abort": {
        200: {
            "description": "Fenced ({id, status: aborted}) or the processed transaction",
            "headers": _HEADERS,
            "content": {
                "application/json": {
                    "schema": {"anyOf": [_ref("KeyStateOut"), _ref("TransactionOut")]}
                }
            },
        },
        409: _problem("request_in_progress"),
    },
    "reversal": {
        200: _json("Reversed (now or earlier)", "TransactionOut"),
        404: _problem("not_found"),
        409: _problem("request_in_progress"),
    },
}


def responses(endpoint: str) -> dict[int | str, dict[str, Any]]:
    return {**_COMMON, **_BY_ENDPOINT[endpoint]}


def list_responses() -> dict[int | str, dict[str, Any]]:
    """``GET /v1/transactions``: its 200 is the route's ``response_model``."""
    return {code: _COMMON[code] for code in (401, 422, 429, 500, 503)}


def add_component_schemas(openapi: dict[str, Any]) -> None:
    schemas = openapi.setdefault("components", {}).setdefault("schemas", {})
    for model in SCHEMA_MODELS:
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        for name, sub in schema.pop("$defs", {}).items():
            schemas[name] = sub
        schemas[model.__name__] = schema
