"""The protocol's decision table (SPEC §4), as one pure function.

``next_action(phase, reply, now=...)`` maps what the server (or the network) answered in
a phase to what the terminal does next:

| phase    | answer                           | action                                   |
|----------|----------------------------------|------------------------------------------|
| create   | 201                              | Finish                                   |
| create   | 202 / 409 / 5xx / lost response  | Retry → lookup (in doubt)                |
| create   | not sent (connect error)         | Retry → create                           |
| create   | 429                              | Retry → create after Retry-After         |
| create   | 410                              | Fence                                    |
| create   | other 4xx (404 included)         | Reject: never processed, not retried     |
| lookup   | 200                              | Finish                                   |
| lookup   | 202 / 409 / 429 / 5xx / no reply | Retry → lookup                           |
| lookup   | 404                              | Retry → create now (same key)            |
| lookup   | 410                              | Fence                                    |
| lookup   | other 4xx                        | GiveUp → abort                           |
| abort    | 200 aborted / expired, or 410    | Fence                                    |
| abort    | 200 transaction                  | Finish                                   |
| abort    | 409 / 429 / 5xx / no reply       | Retry → abort                            |
| abort    | other                            | GiveUp → PaymentInDoubt                  |
| reversal | 200                              | Finish                                   |
| reversal | 409 / 429 / 5xx / no reply       | Retry → reversal                         |
| reversal | other                            | GiveUp → keep the approval               |
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Literal

from ._effects import HttpReply, NoReply, Reply
from ._exceptions import APIError, error_from_response
from ._models import Transaction
from ._retry import parse_retry_after

__all__ = [
    "Action",
    "Fence",
    "Finish",
    "GiveUp",
    "Phase",
    "Reject",
    "Retry",
    "fence_reason",
    "next_action",
]


class Phase(StrEnum):
    CREATE = "create"
    LOOKUP = "lookup"
    ABORT = "abort"
    REVERSAL = "reversal"


@dataclass(frozen=True, slots=True)
class Finish:
    """A definitive transaction (approved, declined or reversed); ``body`` as received."""

    transaction: Transaction
    body: object


@dataclass(frozen=True, slots=True)
class Fence:
    """The key is fenced: never processed, never will be."""

    reason: Literal["aborted", "expired"]
    code: str | None
    request_id: str | None


@dataclass(frozen=True, slots=True)
class Reject:
    """A definitive error for a create that was never processed."""

    error: APIError


@dataclass(frozen=True, slots=True)
class GiveUp:
    """This phase cannot reach an answer; escalate (lookup → abort → in doubt)."""

    error: APIError


@dataclass(frozen=True, slots=True)
class Retry:
    """Wait (``retry_after`` seconds, or backoff when None), then run phase ``then``."""

    then: Phase
    retry_after: float | None
    in_doubt: bool


Action = Finish | Fence | Reject | GiveUp | Retry

_TRANSIENT = frozenset({409, 429})


def fence_reason(code: str | None, marker: str | None) -> Literal["aborted", "expired"]:
    """``expired`` when the code, body status or Idempotency-Status says so."""
    return "expired" if code == "request_expired" or marker == "expired" else "aborted"


def _fence(reply: HttpReply) -> Fence:
    error = error_from_response(reply.status, reply.headers, reply.body)
    marker = reply.headers.get("idempotency-status")
    return Fence(fence_reason(error.code, marker), error.code, error.request_id)


def _finish_or(reply: HttpReply, fallback: Action) -> Action:
    try:
        return Finish(Transaction.from_json(reply.body), reply.body)
    except ValueError:
        return fallback


def _body_status(body: object) -> object:
    return body.get("status") if isinstance(body, Mapping) else None


def next_action(phase: Phase, reply: Reply, *, now: datetime) -> Action:
    """What to do after ``reply`` was received in ``phase`` (pure)."""
    if isinstance(reply, NoReply):
        if phase is Phase.CREATE:
            return Retry(Phase.LOOKUP if reply.sent else Phase.CREATE, None, reply.sent)
        return Retry(phase, None, True)
    wait = parse_retry_after(reply.headers.get("retry-after"), now)
    status = reply.status
    if phase is Phase.CREATE:
        return _after_create(reply, wait)
    if phase is Phase.LOOKUP:
        return _after_lookup(reply, wait)
    if phase is Phase.ABORT and status == 200:
        marker = _body_status(reply.body)
        if marker in ("aborted", "expired"):
            request_id = reply.headers.get("x-request-id")
            return Fence(fence_reason(None, str(marker)), None, request_id)
        return _finish_or(reply, Retry(phase, wait, True))
    if phase is Phase.ABORT and status == 410:
        return _fence(reply)
    if phase is Phase.REVERSAL and status == 200:
        return _finish_or(reply, Retry(phase, wait, True))
    if status in _TRANSIENT or status >= 500:
        return Retry(phase, wait, True)
    return GiveUp(error_from_response(status, reply.headers, reply.body))


def _after_create(reply: HttpReply, wait: float | None) -> Action:
    status = reply.status
    in_doubt = Retry(Phase.LOOKUP, wait, True)
    if status == 202 or status == 409 or status >= 500:
        return in_doubt
    if 200 <= status < 300:
        return _finish_or(reply, in_doubt)
    if status == 410:
        return _fence(reply)
    if status == 429:
        return Retry(Phase.CREATE, wait, False)
    return Reject(error_from_response(status, reply.headers, reply.body))


def _after_lookup(reply: HttpReply, wait: float | None) -> Action:
    status = reply.status
    if status == 200:
        return _finish_or(reply, Retry(Phase.LOOKUP, wait, True))
    if status == 404:
        return Retry(Phase.CREATE, 0.0, False)
    if status == 410:
        return _fence(reply)
    if status == 202 or status in _TRANSIENT or status >= 500:
        return Retry(Phase.LOOKUP, wait, True)
    return GiveUp(error_from_response(status, reply.headers, reply.body))
