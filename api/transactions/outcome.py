"""What a request ended as: the HTTP answer plus what the audit and metrics record."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum

from api.errors import ApiError, error_body
from api.events.writer import RequestOutcome


class IdempotencyStatus(StrEnum):
    """The ``Idempotency-Status`` header of create, lookup and abort (contract §2)."""

    CREATED = "created"
    REPLAYED = "replayed"
    IN_PROGRESS = "in_progress"
    PROCESSED = "processed"
    NOT_FOUND = "not_found"
    ABORTED = "aborted"
    EXPIRED = "expired"


@dataclass(frozen=True, slots=True)
class Outcome:
    status: int
    body: bytes
    event: RequestOutcome  # contract §5 outcome for the request event
    idempotency_status: str | None = None  # the Idempotency-Status header
    headers: dict[str, str] = field(default_factory=dict)
    problem: bool = False
    terminal_id: str | None = None
    retry_after: bool = False  # answered with Retry-After (Settings.retry_after_seconds)
    recheck_s: float | None = None  # in flight, may change by then without a settlement


def from_error(
    error: ApiError,
    *,
    event: RequestOutcome,
    idempotency_status: str | None,
    terminal_id: str | None = None,
) -> Outcome:
    """A named error as a request's answer; rendered by ``router._Call`` (api/errors.py)."""
    return Outcome(
        status=error.status,
        body=error_body(error),
        event=event,
        idempotency_status=idempotency_status,
        headers=error.headers,
        problem=True,
        terminal_id=terminal_id,
        retry_after=error.retry_after,
    )


def key_state_body(key: str, status: str) -> bytes:
    return json.dumps({"id": key, "status": status}, separators=(",", ":")).encode()
