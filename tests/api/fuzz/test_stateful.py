"""Stateful schemathesis (contract §2): sequences of create → lookup / abort / reversal by the
created id (OpenAPI links, added here to the server's own document), and abort → lookup,
with generated inputs. Every step: schemathesis' checks (no 5xx, status codes, content
types, headers and bodies that conform to the schema, a created resource is available)
plus this suite's contract (problem+json codes, Idempotency-Status). Then the database is
whole."""

from __future__ import annotations

import copy
import uuid
from collections import Counter
from typing import Any

import hypothesis
import schemathesis
from hypothesis import HealthCheck
from schemathesis.core.transport import Response
from schemathesis.generation.case import Case

from tests.api.fuzz.conftest import Target
from tests.api.fuzz.contract import assert_whole, check_exchange

CREATE = ("/v1/transactions", "post")
BY_ID = {
    "Lookup": ("/v1/transactions/{transaction_id}", "get"),
    "Abort": ("/v1/transactions/{transaction_id}/abort", "post"),
    "Reversal": ("/v1/transactions/{transaction_id}/reversal", "post"),
}


def _with_links(document: dict[str, Any]) -> dict[str, Any]:
    """create (201/202) → lookup, abort, reversal of `$response.body#/id`; abort/lookup →
    the others too."""
    document = copy.deepcopy(document)
    paths = document["paths"]
    op_ids = {name: paths[path][method]["operationId"] for name, (path, method) in BY_ID.items()}

    def links(exclude: str | None = None) -> dict[str, Any]:
        return {
            name: {
                "operationId": op_id,
                "parameters": {"transaction_id": "$response.body#/id"},
            }
            for name, op_id in op_ids.items()
            if name != exclude
        }

    create = paths[CREATE[0]][CREATE[1]]["responses"]
    for status in ("201", "202"):
        create[status]["links"] = links()
    for name, (path, method) in BY_ID.items():
        paths[path][method]["responses"]["200"]["links"] = links(exclude=name)
    return document


def test_create_then_act_on_the_id(pg_target: Target) -> None:
    import httpx

    target = pg_target
    document = httpx.get(f"{target.server.url}/openapi.json", timeout=10).json()
    schema = schemathesis.openapi.from_dict(_with_links(document))
    auth = {"Authorization": f"Bearer {target.api.api_key}"}
    steps: list[tuple[str, int]] = []

    class Machine(schema.as_state_machine()):  # type: ignore[misc]
        def get_call_kwargs(self, case: Case) -> dict[str, Any]:
            headers = dict(auth)
            if (case.path, case.method.lower()) == CREATE:
                # Mostly a fresh valid key, so that generated bodies reach processing.
                current = (case.headers or {}).get("Idempotency-Key")
                if current is None or len(str(current)) % 4 != 1:
                    headers["Idempotency-Key"] = str(uuid.uuid4())
            return {"base_url": target.server.url, "headers": headers}

        def validate_response(
            self, response: Response, case: Case, additional_checks: Any = None, **kwargs: Any
        ) -> None:
            steps.append((f"{case.method} {case.path}", response.status_code))
            headers = {name.lower(): values[0] for name, values in response.headers.items()}
            check_exchange(
                case.method,
                response.request.path_url.split("?")[0],
                response.status_code,
                headers,
                response.content,
                target.schemas,
            )
            case.validate_response(
                response,
                excluded_checks=[
                    # Business refusals the schema cannot express (410 expired captured_at,
                    # 422 PAN-like digit runs, 422 not_reversible, 409): still checked above.
                    schemathesis.checks.positive_data_acceptance,
                ],
                transport_kwargs=kwargs,
            )

    Machine.run(
        settings=hypothesis.settings(
            max_examples=40,
            stateful_step_count=6,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
    )
    # The links were followed: only an id a create returned can be found by a lookup (200)
    # or reversed (200); a generated id is unknown (404).
    seen = Counter(steps)
    assert seen[("POST /v1/transactions", 201)] > 0, seen
    assert seen[("GET /v1/transactions/{transaction_id}", 200)] > 0, seen
    assert seen[("POST /v1/transactions/{transaction_id}/reversal", 200)] > 0, seen
    assert_whole(target.backend, [target.merchant])
