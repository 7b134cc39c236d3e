"""What every response must look like, whatever the input (contract §2), and what the database
must look like after any amount of bad input (contract §3.1, §8): shared by the fuzz tests."""

from __future__ import annotations

import asyncio
import json
import re
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import httpx
import jsonschema

from api.db import create_engine
from idempay_tools.invariants import InvariantReport, check_invariants
from tests.support.backend import Backend
from tests.support.eventually import eventually
from tests.support.services import Server

IDEMPOTENCY_STATUSES = frozenset(
    {"created", "replayed", "in_progress", "processed", "not_found", "aborted", "expired"}
)
# Every `code` a 4xx may carry: contract §2's table plus the decisions in docs/architecture.md
# (not_found/method_not_allowed for routing) and docs/security.md, "Slow clients".
CODES_4XX = frozenset(
    {
        "idempotency_key_missing",
        "idempotency_key_invalid",
        "unauthorized",
        "not_found",
        "method_not_allowed",
        "request_in_progress",
        "suspected_duplicate",
        "transaction_aborted",
        "request_expired",
        "payload_too_large",
        "idempotency_key_reused",
        "validation_error",
        "pan_not_allowed",
        "clock_skew",
        "advice_too_old",
        "not_reversible",
        "rate_limited",
        "request_timeout",
        "request_headers_too_large",
        "malformed_request",
    }
)
_ID_PATH = re.compile(r"^/v1/transactions/[^/]+(/abort)?$")


def endpoint_of(method: str, path: str) -> str | None:
    """create | lookup | abort | reversal for a (method, path) the router serves, else None."""
    method = method.upper()
    if method == "POST" and path.rstrip("/") == "/v1/transactions":
        return "create"
    if _ID_PATH.match(path):
        if path.endswith("/abort"):
            return "abort" if method == "POST" else None
        return "lookup" if method == "GET" else None
    if method == "POST" and re.match(r"^/v1/transactions/[^/]+/reversal$", path):
        return "reversal"
    return None


@dataclass
class Schemas:
    """The server's own OpenAPI components, to validate 2xx bodies against."""

    document: dict[str, Any]

    def validate(self, name: str, instance: Any) -> None:
        schema = {"$ref": f"#/components/schemas/{name}", **self.document}
        jsonschema.validate(instance, schema)

    def conforms(self, name: str, instance: Any) -> bool:
        try:
            self.validate(name, instance)
        except jsonschema.ValidationError:
            return False
        return True


def load_schemas(server: Server) -> Schemas:
    document = httpx.get(f"{server.url}/openapi.json", timeout=10).json()
    return Schemas({"components": document["components"]})


def check_problem(status: int, content_type: str, raw: bytes) -> dict[str, Any]:
    """A 4xx body: RFC 9457 problem+json with the documented shape and a stable code."""
    assert content_type.startswith("application/problem+json"), (status, content_type, raw[:200])
    problem = json.loads(raw)
    assert isinstance(problem, dict), raw[:200]
    for name in ("type", "title", "detail", "code"):
        assert isinstance(problem.get(name), str) and problem[name], (name, problem)
    assert problem["status"] == status, problem
    assert problem["code"] in CODES_4XX, problem
    assert problem["type"] == f"urn:idempay:problem:{problem['code']}", problem
    return problem


def check_response(
    response: httpx.Response, schemas: Schemas, *, endpoint: str | None = None
) -> None:
    """The contract every response keeps, whatever the request was."""
    check_exchange(
        response.request.method,
        response.request.url.path,
        response.status_code,
        {name.lower(): value for name, value in response.headers.items()},
        response.content,
        schemas,
        endpoint=endpoint,
    )


def check_exchange(
    method: str,
    path: str,
    status: int,
    headers: Mapping[str, str],
    content: bytes,
    schemas: Schemas,
    *,
    endpoint: str | None = None,
) -> None:
    """``headers`` with lower-case names."""
    endpoint = endpoint or endpoint_of(method, path)
    context = (method, path[:200], status, content[:300])
    assert status < 500, context
    assert headers.get("x-request-id"), context
    content_type = headers.get("content-type", "")
    if 400 <= status < 500:
        check_problem(status, content_type, content)
    if endpoint in ("create", "lookup", "abort"):
        assert headers.get("idempotency-status") in IDEMPOTENCY_STATUSES, context
    if endpoint is not None and 200 <= status < 300:
        assert content_type.startswith("application/json"), context
        body = json.loads(content)
        if status == 202:
            schemas.validate("KeyStateOut", body)
            assert body["status"] == "processing", context
            assert headers.get("retry-after"), context
        elif endpoint == "abort":
            assert schemas.conforms("KeyStateOut", body) or schemas.conforms(
                "TransactionOut", body
            ), context
        else:
            schemas.validate("TransactionOut", body)
        if endpoint != "create":
            assert body["id"] == unquote(path.split("/")[3]).lower(), context


@dataclass
class LedgerReport:
    problems: list[str] = field(default_factory=list)
    transactions: int = 0
    keys: int = 0


_EXPECTED_KINDS = {
    ("purchase", "approved"): ["charge"],
    ("refund", "approved"): ["refund"],
    ("purchase", "reversed"): ["charge", "reversal"],
    ("refund", "reversed"): ["refund", "reversal"],
    ("purchase", "declined"): [],
    ("refund", "declined"): [],
}


def ledger_report(backend: Backend, merchant_ids: list[str]) -> LedgerReport:
    """Every transaction whole (its ledger entries, a completed key with its stored response),
    no key without an outcome, no ledger entry or completed key without a transaction."""
    report = LedgerReport()
    params = {f"m{i}": merchant for i, merchant in enumerate(merchant_ids)}
    in_list = ", ".join(f":{name}" for name in params)
    keys = backend.sql(
        "SELECT merchant_id, key, state, response_status, response_body FROM idempotency_key"
        f" WHERE merchant_id IN ({in_list})",
        **params,
    )
    txns = backend.sql(
        f'SELECT merchant_id, id, type, status, amount FROM "transaction"'
        f" WHERE merchant_id IN ({in_list})",
        **params,
    )
    entries = backend.sql(
        "SELECT merchant_id, transaction_id, kind, amount FROM ledger_entry"
        f" WHERE merchant_id IN ({in_list})",
        **params,
    )
    report.transactions, report.keys = len(txns), len(keys)
    key_rows = {(row[0], row[1]): row for row in keys}
    txn_rows = {(row[0], row[1]): row for row in txns}
    by_txn: dict[tuple[str, str], list[tuple[str, int]]] = defaultdict(list)
    for merchant, txn_id, kind, amount in entries:
        by_txn[(merchant, txn_id)].append((kind, int(amount)))
    problems = report.problems
    for ident, (_, _, state, response_status, response_body) in key_rows.items():
        if state not in ("completed", "aborted", "expired"):
            problems.append(f"key {ident} stuck in state {state}")
        if state == "completed":
            if ident not in txn_rows:
                problems.append(f"completed key {ident} has no transaction")
            if response_status is None or not response_body:
                problems.append(f"completed key {ident} has no stored response")
        elif ident in txn_rows:
            problems.append(f"{state} key {ident} has a transaction")
    for ident, (_, _, txn_type, status, amount) in txn_rows.items():
        key = key_rows.get(ident)
        if key is None or key[2] != "completed":
            problems.append(f"transaction {ident} has no completed key ({key and key[2]})")
        expected = _EXPECTED_KINDS.get((txn_type, status))
        found = by_txn.get(ident, [])
        kinds = sorted(kind for kind, _ in found)
        if expected is None or kinds != sorted(expected):
            problems.append(f"transaction {ident} ({txn_type}, {status}) has entries {kinds}")
            continue
        signed = -int(amount) if txn_type == "refund" else int(amount)
        balance = {"approved": signed, "reversed": 0, "declined": 0}[status]
        if sum(value for _, value in found) != balance:
            problems.append(f"transaction {ident} entries {found} do not sum to {balance}")
    for ident in by_txn:
        if ident not in txn_rows:
            problems.append(f"ledger entries without a transaction: {ident}")
    return report


def wait_for_outcomes(backend: Backend, merchant_ids: list[str], timeout: float = 20.0) -> None:
    """Let the completer finish keys still processing (slow issuer paths), then return."""
    params = {f"m{i}": merchant for i, merchant in enumerate(merchant_ids)}
    in_list = ", ".join(f":{name}" for name in params)
    eventually(
        lambda: backend.sql(
            "SELECT merchant_id, key FROM idempotency_key WHERE state = 'processing'"
            f" AND merchant_id IN ({in_list})",
            **params,
        ),
        until=lambda processing: not processing,
        what="the completer to settle every key left processing",
        timeout=timeout,
        interval=0.3,
    )


def assert_whole(backend: Backend, merchant_ids: list[str]) -> LedgerReport:
    """No half-written transaction and contract §8's invariants, after the completer settled."""
    wait_for_outcomes(backend, merchant_ids)
    report = ledger_report(backend, merchant_ids)
    assert not report.problems, report.problems[:20]
    invariants = asyncio.run(_invariants(backend, merchant_ids))
    assert invariants.ok, (invariants.failed(), invariants.violations[:10])
    return report


async def _invariants(backend: Backend, merchant_ids: list[str]) -> InvariantReport:
    engine = create_engine(backend.settings)
    try:
        return await check_invariants(engine, merchant_ids=merchant_ids)
    finally:
        await engine.dispose()


def merchant_id(backend: Backend, api_key: str) -> str:
    import hashlib

    digest = hashlib.sha256(api_key.encode()).hexdigest()
    rows = backend.sql("SELECT merchant_id FROM api_key WHERE key_hash = :h", h=digest)
    return str(rows[0][0])
