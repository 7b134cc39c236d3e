"""OpenAPI documentation of the transaction routes (the body is parsed by hand so that auth,
size, JSON, PAN and schema checks run in that order; this file tells the schema).

Everything here is read by people integrating a terminal: descriptions say what the API
does and wants, never how the server is built (no module, class or function names)."""

from __future__ import annotations

import copy
from typing import Any

from api.transactions.schemas import KeyStateOut, Problem, TransactionCreate, TransactionOut

SCHEMA_MODELS = (TransactionCreate, TransactionOut, KeyStateOut, Problem)

BEARER = "bearerAuth"
SECURITY: list[dict[str, list[str]]] = [{BEARER: []}]
SECURITY_SCHEMES: dict[str, Any] = {
    BEARER: {
        "type": "http",
        "scheme": "bearer",
        "description": "The merchant's API key: `Authorization: Bearer <api_key>`. An operator "
        "creates one with `idempay admin create-key --merchant NAME` (the key is the last line "
        "it prints). A missing, unknown or revoked key is 401 `unauthorized`.",
    }
}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


EXAMPLE_KEY = "0b7e2a1c-6f1d-4c55-9a3e-1d2f3a4b5c6d"
AMOUNT_DESCRIPTION = (
    "Integer minor units of `currency` (cents, centavos; yen for JPY), 1 to 10^12: "
    "1250 BRL is R$ 12.50. Never a decimal."
)
_AMOUNT_EXAMPLES = [1250, 54990]

IDEMPOTENCY_KEY: dict[str, Any] = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": True,
    "description": "A UUID the terminal mints for this payment (any version; UUIDv7 "
    "recommended) and keeps until it has a definitive answer: every retry of the payment "
    "sends the same key and the same body, and is processed at most once. Canonical "
    "8-4-4-4-12 form, any case; the UUID as an RFC 8941 quoted string is accepted too. "
    "Missing: 400 `idempotency_key_missing`; not a UUID: 400 `idempotency_key_invalid`. "
    "Keys are scoped to the merchant of the API key.",
    # A UUID, said in words and by the example: ``format: uuid`` here turns the schemathesis
    # suite's negative run red — it swaps its own UUID into the request after generation, so
    # a generated non-UUID it replaced counts as one the server accepted.
    "schema": {"type": "string"},
    "example": EXAMPLE_KEY,
}
IDEMPOTENCY_ATTEMPT: dict[str, Any] = {
    "name": "Idempotency-Attempt",
    "in": "header",
    "required": False,
    "description": "Optional: the terminal's attempt number for this key (1 for the first "
    "send, 2 for the first retry, …), a whole number ≥ 1 in decimal digits. Recorded for the "
    "retry audit only; a value that is not such a number is recorded as unknown, never "
    "refused.",
    "schema": {"type": "string"},
    "example": "1",
}
POS_NETWORK: dict[str, Any] = {
    "name": "POS-Network",
    "in": "header",
    "required": False,
    "description": "Optional: the terminal's link — `gprs`, `3g`, `4g`, `wifi`, `ethernet` or "
    "`other` (any case). Recorded for the audit's per-network figures; any other value is "
    "recorded as `other`, never refused.",
    "schema": {"type": "string"},
    "example": "gprs",
}
PREFER: dict[str, Any] = {
    "name": "Prefer",
    "in": "header",
    "required": False,
    "description": "Optional: `wait=N` (RFC 7240; N whole seconds, capped by the server, 20 by "
    "default). When the answer would say the key is still in flight (a lookup's 202, a "
    "duplicate create's or an abort's 409), the server holds the request until the key "
    "settles or N seconds pass, and answers as it would then; `Preference-Applied: wait=N` "
    "says it waited. A malformed preference is ignored.",
    "schema": {"type": "string"},
    "example": "wait=10",
}
TRANSACTION_ID_DESCRIPTION = (
    "The transaction's id: the `Idempotency-Key` it was created with (a UUID). Only the "
    "caller's merchant's keys are found; another merchant's key answers exactly like an "
    "unknown one. Not a UUID: 400 `idempotency_key_invalid`."
)
TRANSACTION_ID_EXAMPLE = EXAMPLE_KEY

_CARD = {"token": "tok_visa_4242", "last4": "4242", "brand": "visa"}
CREATE_EXAMPLES: dict[str, dict[str, Any]] = {
    "purchase": {
        "summary": "A purchase of R$ 12.50 (amount in centavos)",
        "value": {"terminal_id": "T-0001", "amount": 1250, "currency": "BRL", "card": _CARD},
    },
    "installments": {
        "summary": "R$ 549.90 in 3 installments, with the merchant's own reference",
        "value": {
            "terminal_id": "T-0001",
            "type": "purchase",
            "amount": 54990,
            "currency": "BRL",
            "card": _CARD,
            "installments": 3,
            "metadata": {"order": "A-1042"},
        },
    },
    "refund": {
        "summary": "A refund of US$ 5.00 (amount in cents)",
        "value": {
            "terminal_id": "T-0001",
            "type": "refund",
            "amount": 500,
            "currency": "USD",
            "card": _CARD,
        },
    },
}

CREATE_DOC: dict[str, Any] = {
    "operationId": "createTransaction",
    "security": SECURITY,
    "parameters": [IDEMPOTENCY_KEY, IDEMPOTENCY_ATTEMPT, POS_NETWORK, PREFER],
    "requestBody": {
        "required": True,
        "description": "The payment. `amount` is in integer minor units of `currency`. "
        "Unknown fields are 422; anything that looks like a card number is 422 "
        "`pan_not_allowed` and is neither stored nor logged; over 16 KiB is 413.",
        "content": {
            "application/json": {
                "schema": _ref("TransactionCreate"),
                "examples": CREATE_EXAMPLES,
            }
        },
    },
}
CREATE_DESCRIPTION = (
    "Processes a card payment exactly once per `Idempotency-Key`. The acquirer decides it: "
    "201 with the transaction (`approved` or `declined`); 202 `processing` when the acquirer "
    "has not answered within the server's answer time (the server finishes it; look the key "
    "up). After any lost or failed answer, resend the same body with the same key — a "
    "processed key answers the identical body again (`Idempotent-Replayed: true`) — or look "
    "the key up. Every answer carries `Idempotency-Status`."
)


def by_id_doc(operation_id: str, *, prefer: bool) -> dict[str, Any]:
    """The ``openapi_extra`` of an operation on one key: its id, bearer security and, where
    the contract allows waiting, ``Prefer``."""
    doc: dict[str, Any] = {"operationId": operation_id, "security": SECURITY}
    if prefer:
        doc["parameters"] = [PREFER]
    return doc


LIST_DOC: dict[str, Any] = {"operationId": "listTransactions", "security": SECURITY}

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
    401: _problem("unauthorized: no API key, or an unknown or revoked one"),
    408: _problem("request_timeout: the body did not arrive in time; nothing was processed"),
    422: _problem(
        "validation_error (`errors` lists the fields) / pan_not_allowed / clock_skew / "
        "idempotency_key_reused / advice_too_old / not_reversible"
    ),
    429: _problem("rate_limited: wait `Retry-After`"),
    500: _problem("internal_error: nothing was stored under the key; retrying it is safe"),
    503: _problem("service_unavailable: nothing was processed; retrying it is safe"),
}

_BY_ENDPOINT: dict[str, dict[int | str, dict[str, Any]]] = {
    "create": {
        201: _json("Processed (approved/declined), or the identical replay", "TransactionOut"),
        202: _json("The acquirer has not answered yet; the server finishes it", "KeyStateOut"),
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
    """The bodies' schemas (``amount`` described in minor units, with examples) and the
    bearer security scheme."""
    components = openapi.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    for model in SCHEMA_MODELS:
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        for name, sub in schema.pop("$defs", {}).items():
            schemas[name] = sub
        schemas[model.__name__] = schema
    for name in ("TransactionCreate", "TransactionOut"):
        amount = schemas[name]["properties"]["amount"]
        amount["description"] = AMOUNT_DESCRIPTION
        amount["examples"] = list(_AMOUNT_EXAMPLES)
    components["securitySchemes"] = copy.deepcopy(SECURITY_SCHEMES)
