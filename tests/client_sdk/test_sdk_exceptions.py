"""Every problem ``code`` of contract §2 maps to its own typed error (client_sdk/_exceptions.py)."""

from __future__ import annotations

import pytest

import client_sdk
from client_sdk import (
    APIError,
    ClockSkewError,
    IdempayError,
    IdempotencyKeyInvalidError,
    IdempotencyKeyMissingError,
    IdempotencyKeyReusedError,
    NotFoundError,
    NotReversibleError,
    PanNotAllowedError,
    PayloadTooLargeError,
    RateLimitedError,
    RequestExpiredError,
    RequestInProgressError,
    RequestTimeoutError,
    ServerError,
    ServiceUnavailableError,
    TransactionAbortedError,
    UnauthorizedError,
    ValidationFailedError,
)
from client_sdk._exceptions import error_from_response

SPEC_CODES = [
    (400, "idempotency_key_missing", IdempotencyKeyMissingError),
    (400, "idempotency_key_invalid", IdempotencyKeyInvalidError),
    (401, "unauthorized", UnauthorizedError),
    (404, "not_found", NotFoundError),
    (408, "request_timeout", RequestTimeoutError),
    (409, "request_in_progress", RequestInProgressError),
    (410, "transaction_aborted", TransactionAbortedError),
    (410, "request_expired", RequestExpiredError),
    (413, "payload_too_large", PayloadTooLargeError),
    (422, "idempotency_key_reused", IdempotencyKeyReusedError),
    (422, "validation_error", ValidationFailedError),
    (422, "pan_not_allowed", PanNotAllowedError),
    (422, "clock_skew", ClockSkewError),
    (422, "not_reversible", NotReversibleError),
    (429, "rate_limited", RateLimitedError),
    (503, "service_unavailable", ServiceUnavailableError),
]


@pytest.mark.parametrize(("status", "code", "error_type"), SPEC_CODES)
def test_every_spec_code_maps_to_its_class_with_code_status_request_id_detail(
    status: int, code: str, error_type: type[APIError]
) -> None:
    body = {
        "type": "about:blank",
        "title": "t",
        "status": status,
        "detail": f"why {code}",
        "code": code,
    }
    error = error_from_response(status, {"x-request-id": "req_123"}, body)
    assert type(error) is error_type
    assert isinstance(error, APIError)
    assert (error.code, error.status, error.request_id, error.detail) == (
        code,
        status,
        "req_123",
        f"why {code}",
    )
    assert error.body == body
    assert code in str(error)


@pytest.mark.parametrize(
    ("status", "error_type"),
    [
        (401, UnauthorizedError),
        (404, NotFoundError),
        (408, RequestTimeoutError),
        (429, RateLimitedError),
        (500, ServerError),
        (502, ServerError),
        (503, ServiceUnavailableError),
        (418, APIError),
    ],
)
def test_answers_without_a_known_code_fall_back_on_the_status(
    status: int, error_type: type[APIError]
) -> None:
    error = error_from_response(status, {}, "<html>oops</html>")
    assert type(error) is error_type
    assert (error.code, error.status, error.request_id) == (None, status, None)


def test_unknown_codes_keep_the_code_on_a_status_based_class() -> None:
    error = error_from_response(422, {}, {"code": "something_new", "detail": "d"})
    assert type(error) is ValidationFailedError
    assert error.code == "something_new"


def test_the_tree_is_rooted_at_idempay_error_and_pan_is_a_validation_failure() -> None:
    assert issubclass(PanNotAllowedError, ValidationFailedError)
    assert issubclass(ClockSkewError, ValidationFailedError)
    assert issubclass(ServiceUnavailableError, ServerError)
    for name in client_sdk.__all__:
        value = getattr(client_sdk, name)
        if isinstance(value, type) and issubclass(value, Exception):
            assert issubclass(value, IdempayError), name


def test_the_module_docstring_draws_every_exception_class() -> None:
    from client_sdk import _exceptions

    doc = _exceptions.__doc__ or ""
    for name in _exceptions.__all__:
        if isinstance(getattr(_exceptions, name), type):
            assert name in doc, name


DEPRECATED = [
    "IdempotencyKeyMissing",
    "IdempotencyKeyInvalid",
    "Unauthorized",
    "NotFound",
    "RequestInProgress",
    "TransactionAborted",
    "RequestExpired",
    "PayloadTooLarge",
    "IdempotencyKeyReused",
    "ValidationFailed",
    "PanNotAllowed",
    "NotReversible",
    "RateLimited",
    "ServiceUnavailable",
    "PaymentAborted",
    "PaymentInDoubt",
    "InvalidTransition",
]


@pytest.mark.parametrize("old", DEPRECATED)
def test_the_old_names_are_the_same_classes_for_one_release(old: str) -> None:
    from client_sdk import _exceptions

    new = getattr(client_sdk, f"{old}Error")
    assert getattr(client_sdk, old) is new
    assert old in client_sdk.__all__ and f"{old}Error" in client_sdk.__all__
    assert f"``{old}``" in (_exceptions.__doc__ or "")


def test_an_old_name_still_catches_what_the_sdk_raises() -> None:
    error = error_from_response(404, {}, {"code": "not_found"})
    with pytest.raises(client_sdk.NotFound):
        raise error
    assert type(error).__name__ == "NotFoundError"
