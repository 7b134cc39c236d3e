"""What a request ended as: the HTTP answer plus what the audit and metrics record."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from api.errors import ApiError, problem_body


@dataclass(frozen=True, slots=True)
class Outcome:
    status: int
    body: bytes
    event: str  # SPEC §5 outcome for the request event
    idempotency_status: str | None = None  # the Idempotency-Status header
    headers: dict[str, str] = field(default_factory=dict)
    problem: bool = False
    terminal_id: str | None = None


def from_error(
    error: ApiError, *, event: str, idempotency_status: str | None, terminal_id: str | None = None
) -> Outcome:
    return Outcome(
        status=error.status,
        body=problem_body(error.status, error.code, error.detail, error.extra),
        event=event,
        idempotency_status=idempotency_status,
        headers=error.headers,
        problem=True,
        terminal_id=terminal_id,
    )


def key_state_body(key: str, status: str) -> bytes:
    return json.dumps({"id": key, "status": status}, separators=(",", ":")).encode()
