"""The protocol's decision table (contract §4), as one pure function.

``next_action(phase, reply, now=..., expect=...)`` maps what the server (or the network)
answered in a phase to what the terminal does next. A transaction (or fence) body is an
answer only when it is about this payment (``Expected``: same id, type, amount and
currency); any other body — a misbehaving proxy or cache — leaves the payment in doubt
and is retried like a lost answer.

| phase    | answer                           | action                                   |
|----------|----------------------------------|------------------------------------------|
| create   | 201                              | Finish                                   |
| create   | 202 / 408 / 409 / 5xx / lost     | Retry → lookup (in doubt)                |
| create   | 409 suspected_duplicate          | Reject (the protocol fences the key)     |
| create   | not sent (connect error)         | Retry → create                           |
| create   | 429                              | Retry → create after Retry-After         |
| create   | 410                              | Fence                                    |
| create   | other 4xx (404 included)         | Reject: this attempt was not processed   |
| lookup   | 200                              | Finish                                   |
| lookup   | 202 / 408 / 409 / 429 / 5xx / —  | Retry → lookup                           |
| lookup   | 404                              | Retry → create now (same key)            |
|          |                                  | (the protocol may fence or wait instead) |
| lookup   | 410                              | Fence                                    |
| lookup   | other 4xx                        | GiveUp → abort                           |
| abort    | 200 aborted / expired, or 410    | Fence                                    |
| abort    | 200 transaction                  | Finish                                   |
| abort    | 408 / 409 / 429 / 5xx / no reply | Retry → abort                            |
| abort    | other                            | GiveUp → PaymentInDoubtError                  |
| reversal | 200                              | Finish                                   |
| reversal | 408 / 409 / 429 / 5xx / no reply | Retry → reversal                         |
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
    "Expected",
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
    """Wait (backoff, or longer when ``retry_after`` says so), then run phase ``then``;
    ``now``: run it at once (a 404 lookup: the resend is the next step, not a retry)."""

    then: Phase
    retry_after: float | None
    in_doubt: bool
    now: bool = False


@dataclass(frozen=True, slots=True)
class Expected:
    """What an answer about this payment must say."""

    key: str
    type: str | None
    amount: int | None
    currency: str | None

    def matches(self, transaction: Transaction) -> bool:
        pairs = (
            (transaction.id.lower(), self.key.lower()),
            (transaction.type, self.type),
            (transaction.amount, self.amount),
            (transaction.currency, self.currency),
        )
        return all(got == want for got, want in pairs if want is not None)

    def about_key(self, body: object) -> bool:
        """A fence body is about this key when its id (if it carries one) is the key."""
        found = body.get("id") if isinstance(body, Mapping) else None
        return found is None or str(found).lower() == self.key.lower()


Action = Finish | Fence | Reject | GiveUp | Retry

_TRANSIENT = frozenset({408, 409, 429})


def fence_reason(code: str | None, marker: str | None) -> Literal["aborted", "expired"]:
    """``expired`` when the code, body status or Idempotency-Status says so."""
    return "expired" if code == "request_expired" or marker == "expired" else "aborted"


def _fence(reply: HttpReply) -> Fence:
    error = error_from_response(reply.status, reply.headers, reply.body)
    marker = reply.headers.get("idempotency-status")
    return Fence(fence_reason(error.code, marker), error.code, error.request_id)


def _finish_or(reply: HttpReply, fallback: Action, expect: Expected | None) -> Action:
    try:
        transaction = Transaction.from_json(reply.body)
    except (ValueError, TypeError):
        return fallback
    if expect is not None and not expect.matches(transaction):
        return fallback
    return Finish(transaction, reply.body)


def _problem_code(body: object) -> object:
    return body.get("code") if isinstance(body, Mapping) else None


def _body_status(body: object) -> object:
    return body.get("status") if isinstance(body, Mapping) else None


def next_action(
    phase: Phase, reply: Reply, *, now: datetime, expect: Expected | None = None
) -> Action:
    """What to do after ``reply`` was received in ``phase`` (pure)."""
    if isinstance(reply, NoReply):
        if phase is Phase.CREATE:
            return Retry(Phase.LOOKUP if reply.sent else Phase.CREATE, None, reply.sent)
        return Retry(phase, None, True)
    wait = parse_retry_after(reply.headers.get("retry-after"), now)
    status = reply.status
    if phase is Phase.CREATE:
        return _after_create(reply, wait, expect)
    if phase is Phase.LOOKUP:
        return _after_lookup(reply, wait, expect)
    if phase is Phase.ABORT and status == 200:
        marker = _body_status(reply.body)
        if marker in ("aborted", "expired"):
            if expect is not None and not expect.about_key(reply.body):
                return Retry(phase, wait, True)
            request_id = reply.headers.get("x-request-id")
            return Fence(fence_reason(None, str(marker)), None, request_id)
        return _finish_or(reply, Retry(phase, wait, True), expect)
    if phase is Phase.ABORT and status == 410:
        return _fence(reply)
    if phase is Phase.REVERSAL and status == 200:
        return _finish_or(reply, Retry(phase, wait, True), expect)
    if status in _TRANSIENT or status >= 500:
        return Retry(phase, wait, True)
    return GiveUp(error_from_response(status, reply.headers, reply.body))


def _after_create(reply: HttpReply, wait: float | None, expect: Expected | None) -> Action:
    status = reply.status
    in_doubt = Retry(Phase.LOOKUP, wait, True)
    if status == 409 and _problem_code(reply.body) == "suspected_duplicate":
        # The duplicate guard refused this attempt: not the key in flight (409's other code).
        return Reject(error_from_response(status, reply.headers, reply.body))
    if status in (202, 408, 409) or status >= 500:
        return in_doubt
    if 200 <= status < 300:
        return _finish_or(reply, in_doubt, expect)
    if status == 410:
        return _fence(reply)
    if status == 429:
        return Retry(Phase.CREATE, wait, False)
    return Reject(error_from_response(status, reply.headers, reply.body))


def _after_lookup(reply: HttpReply, wait: float | None, expect: Expected | None) -> Action:
    status = reply.status
    if status == 200:
        return _finish_or(reply, Retry(Phase.LOOKUP, wait, True), expect)
    if status == 404:
        return Retry(Phase.CREATE, None, False, now=True)
    if status == 410:
        return _fence(reply)
    if status == 202 or status in _TRANSIENT or status >= 500:
        return Retry(Phase.LOOKUP, wait, True)
    return GiveUp(error_from_response(status, reply.headers, reply.body))
