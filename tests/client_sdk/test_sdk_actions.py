"""The protocol's decision table (client_sdk/_actions.py), row by row."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from client_sdk import (
    IdempotencyKeyReusedError,
    PanNotAllowedError,
    PayloadTooLargeError,
    UnauthorizedError,
    ValidationFailedError,
)
from client_sdk._actions import Fence, Finish, GiveUp, Phase, Reject, Retry, next_action
from client_sdk._effects import HttpReply, NoReply, Reply

NOW = datetime(2026, 11, 20, 12, 0, 0, tzinfo=UTC)
KEY = "01a1ee56-5e00-7d97-86ac-d904da6cff77"
TXN = {
    "id": KEY,
    "status": "approved",
    "decline_reason": None,
    "authorization_code": "A1",
    "terminal_id": "T-0001",
    "type": "purchase",
    "amount": 1250,
    "currency": "BRL",
    "card": {"last4": "4242", "brand": "visa"},
    "installments": 1,
    "created_at": "2026-11-20T12:00:00Z",
    "processed_at": "2026-11-20T12:00:01Z",
    "reversed_at": None,
}


def http(status: int, body: Any = None, **headers: str) -> HttpReply:
    return HttpReply(status, {k.replace("_", "-"): v for k, v in headers.items()}, body)


def problem(status: int, code: str, **headers: str) -> HttpReply:
    return http(status, {"code": code, "status": status, "detail": code}, **headers)


LOST = NoReply(sent=True, error="ReadTimeout")
UNSENT = NoReply(sent=False, error="ConnectError")
C, L, A, R = Phase.CREATE, Phase.LOOKUP, Phase.ABORT, Phase.REVERSAL

RETRIES: list[tuple[Phase, Reply, Retry]] = [
    (C, http(202, {"id": KEY, "status": "processing"}, retry_after="1"), Retry(L, 1.0, True)),
    (C, problem(409, "request_in_progress", retry_after="2"), Retry(L, 2.0, True)),
    (C, http(500, None), Retry(L, None, True)),
    (C, problem(503, "service_unavailable", retry_after="3"), Retry(L, 3.0, True)),
    (C, http(502, None), Retry(L, None, True)),
    (C, LOST, Retry(L, None, True)),
    (C, UNSENT, Retry(C, None, False)),
    (C, problem(429, "rate_limited", retry_after="4"), Retry(C, 4.0, False)),
    (C, http(201, {"id": KEY, "status": "garbled"}), Retry(L, None, True)),
    (L, http(202, {"id": KEY, "status": "processing"}, retry_after="1"), Retry(L, 1.0, True)),
    (L, problem(409, "request_in_progress"), Retry(L, None, True)),
    (L, problem(404, "not_found"), Retry(C, None, False, now=True)),
    (L, problem(429, "rate_limited", retry_after="5"), Retry(L, 5.0, True)),
    (L, http(500), Retry(L, None, True)),
    (L, LOST, Retry(L, None, True)),
    (L, UNSENT, Retry(L, None, True)),
    (A, problem(409, "request_in_progress", retry_after="1"), Retry(A, 1.0, True)),
    (A, problem(503, "service_unavailable"), Retry(A, None, True)),
    (A, LOST, Retry(A, None, True)),
    (R, problem(409, "request_in_progress"), Retry(R, None, True)),
    (R, http(500), Retry(R, None, True)),
    (R, UNSENT, Retry(R, None, True)),
]


@pytest.mark.parametrize(("phase", "reply", "expected"), RETRIES)
def test_transient_answers_retry_the_right_phase(
    phase: Phase, reply: Reply, expected: Retry
) -> None:
    assert next_action(phase, reply, now=NOW) == expected


@pytest.mark.parametrize(
    ("phase", "reply"),
    [
        (C, http(201, TXN)),
        (L, http(200, TXN)),
        (A, http(200, TXN)),
        (R, http(200, {**TXN, "status": "reversed", "reversed_at": "2026-11-20T12:05:00Z"})),
    ],
)
def test_a_transaction_body_finishes(phase: Phase, reply: HttpReply) -> None:
    action = next_action(phase, reply, now=NOW)
    assert isinstance(action, Finish)
    assert action.transaction.id == KEY
    assert action.body == reply.body


@pytest.mark.parametrize(
    ("phase", "reply", "reason", "code"),
    [
        (
            C,
            problem(410, "transaction_aborted", idempotency_status="aborted"),
            "aborted",
            "transaction_aborted",
        ),
        (
            C,
            problem(410, "request_expired", idempotency_status="expired"),
            "expired",
            "request_expired",
        ),
        (L, problem(410, "transaction_aborted"), "aborted", "transaction_aborted"),
        (L, problem(410, "request_expired"), "expired", "request_expired"),
        (A, http(200, {"id": KEY, "status": "aborted"}), "aborted", None),
        (A, http(200, {"id": KEY, "status": "expired"}), "expired", None),
        (A, problem(410, "transaction_aborted"), "aborted", "transaction_aborted"),
    ],
)
def test_fenced_keys_fence(phase: Phase, reply: HttpReply, reason: str, code: str) -> None:
    action = next_action(phase, reply, now=NOW)
    assert isinstance(action, Fence)
    assert (action.reason, action.code) == (reason, code)


@pytest.mark.parametrize(
    ("reply", "error_type"),
    [
        (problem(400, "validation_error"), ValidationFailedError),
        (problem(401, "unauthorized"), UnauthorizedError),
        (problem(404, "not_found"), Exception),
        (problem(413, "payload_too_large"), PayloadTooLargeError),
        (problem(422, "idempotency_key_reused"), IdempotencyKeyReusedError),
        (problem(422, "pan_not_allowed"), PanNotAllowedError),
    ],
)
def test_client_errors_on_create_are_rejected_not_retried(
    reply: HttpReply, error_type: type[Exception]
) -> None:
    action = next_action(C, reply, now=NOW)
    assert isinstance(action, Reject)
    assert isinstance(action.error, error_type)
    assert action.error.status == reply.status


@pytest.mark.parametrize(
    ("phase", "reply"),
    [
        (L, problem(401, "unauthorized")),
        (L, problem(400, "idempotency_key_invalid")),
        (A, problem(401, "unauthorized")),
        (A, http(404)),
        (R, problem(422, "not_reversible")),
        (R, problem(404, "not_found")),
    ],
)
def test_errors_that_leave_the_phase_without_an_answer_give_up(
    phase: Phase, reply: HttpReply
) -> None:
    assert isinstance(next_action(phase, reply, now=NOW), GiveUp)


def test_retry_after_as_http_date_is_converted_to_seconds() -> None:
    reply = problem(409, "request_in_progress", retry_after="Fri, 20 Nov 2026 12:00:09 GMT")
    assert next_action(L, reply, now=NOW) == Retry(L, 9.0, True)
