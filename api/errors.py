"""Named, status-coded errors, rendered in one place as RFC 9457 problem+json.

    ApiError                         status, code, title; retry_after: Retry-After wanted
    ├── IdempotencyKeyMissingError   400 idempotency_key_missing
    ├── IdempotencyKeyInvalidError   400 idempotency_key_invalid
    ├── UnauthorizedError            401 unauthorized
    ├── NotFoundError                404 not_found
    ├── RequestInProgressError       409 request_in_progress   (Retry-After)
    ├── SuspectedDuplicateError      409 suspected_duplicate   (duplicate_of)
    ├── TransactionAbortedError      410 transaction_aborted
    ├── RequestExpiredError          410 request_expired
    ├── PayloadTooLargeError         413 payload_too_large
    ├── IdempotencyKeyReusedError    422 idempotency_key_reused
    ├── ValidationFailedError        422 validation_error
    ├── PanNotAllowedError           422 pan_not_allowed
    ├── ClockSkewError               422 clock_skew
    ├── AdviceTooOldError            422 advice_too_old
    ├── NotReversibleError           422 not_reversible
    ├── RateLimitedError             429 rate_limited          (Retry-After of the window)
    ├── InternalError                500 internal_error        (Retry-After)
    └── ServiceUnavailableError      503 service_unavailable   (Retry-After)

Services raise (or answer with) these; ``problem_body`` + ``problem_headers`` are the one
rendering, used by the transaction routes (``router._Call``, which the lean ASGI route goes
through too) and by the app's exception handlers (``problem_response``). ``Retry-After``
always comes from ``Settings.retry_after_seconds`` unless the error carries its own.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from starlette.responses import Response

from api.storage_errors import storage_unavailable

PROBLEM_JSON = "application/problem+json"


class ApiError(Exception):
    """An error with an HTTP status and a stable machine-readable ``code``."""

    status: int = 500
    code: str = "http_error"
    title: ClassVar[str] = "HTTP error"
    retry_after: bool = False  # answer with Retry-After (from settings)

    def __init__(
        self,
        status: int,
        code: str,
        detail: str,
        *,
        headers: dict[str, str] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail
        self.headers = headers or {}
        self.extra = extra or {}


class _NamedError(ApiError):
    """A subclass fixes status and code; a raiser gives only the detail."""

    def __init__(
        self,
        detail: str,
        *,
        headers: dict[str, str] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        cls = type(self)
        super().__init__(cls.status, cls.code, detail, headers=headers, extra=extra)


class IdempotencyKeyMissingError(_NamedError):
    """The create came without an ``Idempotency-Key`` header."""

    status, code, title = 400, "idempotency_key_missing", "Idempotency-Key header is required"


class IdempotencyKeyInvalidError(_NamedError):
    """The ``Idempotency-Key`` (or the id in the path) is not a canonical UUID."""

    status, code, title = 400, "idempotency_key_invalid", "Idempotency-Key is not a UUID"


class UnauthorizedError(_NamedError):
    """No API key, or one that belongs to no merchant."""

    status, code, title = 401, "unauthorized", "Missing or unknown API key"


class NotFoundError(_NamedError):
    """Nothing was processed under this key (or this merchant has no such key)."""

    status, code, title = 404, "not_found", "Not found"


class RequestInProgressError(_NamedError):
    """The key is being processed right now; retry after Retry-After."""

    status, code, title = 409, "request_in_progress", "A request with this key is being processed"
    retry_after = True


class SuspectedDuplicateError(_NamedError):
    """The merchant's duplicate guard: an approved purchase of the same card, amount and
    terminal within the window under another key (``duplicate_of``); nothing was stored."""

    status, code = 409, "suspected_duplicate"
    title = "Suspected duplicate of a recent payment"


class TransactionAbortedError(_NamedError):
    """The key was fenced by an abort: never processed, and never will be."""

    status, code, title = 410, "transaction_aborted", "The key was fenced by an abort"


class RequestExpiredError(_NamedError):
    """The request arrived too late (``expires_at``, retention window); the key is fenced."""

    status, code = 410, "request_expired"
    title = "The request expired before it could be processed"


class PayloadTooLargeError(_NamedError):
    """The body is over the 16 KiB limit."""

    status, code, title = 413, "payload_too_large", "Request body too large"


class IdempotencyKeyReusedError(_NamedError):
    """The key was used before with a different request body."""

    status, code = 422, "idempotency_key_reused"
    title = "Idempotency-Key reused with a different request"


class ValidationFailedError(_NamedError):
    """The body (or a parameter) is invalid; ``errors`` lists where."""

    status, code, title = 422, "validation_error", "The request is invalid"


class PanNotAllowedError(_NamedError):
    """A value in the body looks like a card number; nothing was stored or logged."""

    status, code, title = 422, "pan_not_allowed", "Card numbers must not be sent; use a card token"


class ClockSkewError(_NamedError):
    """A time in the request is further ahead of the server's clock than the tolerance."""

    status, code = 422, "clock_skew"
    title = "The request's time is too far ahead of the server's clock"


class AdviceTooOldError(_NamedError):
    """An offline advice captured longer ago than the retention window; nothing was stored."""

    status, code = 422, "advice_too_old"
    title = "The offline advice is older than the retention window"


class NotReversibleError(_NamedError):
    """Only an approved transaction can be reversed."""

    status, code, title = 422, "not_reversible", "The transaction cannot be reversed"


class RateLimitedError(_NamedError):
    """Too many requests for this API key or terminal; retry after Retry-After."""

    status, code, title = 429, "rate_limited", "Too many requests"
    retry_after = True


class InternalError(_NamedError):
    """A bug, not an outage; nothing was stored under the key."""

    status, code, title = 500, "internal_error", "Internal error; nothing was stored under the key"


class ServiceUnavailableError(_NamedError):
    """Storage is unreachable; nothing was processed and a retry with the same key is safe."""

    status, code, title = 503, "service_unavailable", "Storage unavailable; nothing was processed"
    retry_after = True


NAMED_ERRORS: tuple[type[ApiError], ...] = (
    IdempotencyKeyMissingError,
    IdempotencyKeyInvalidError,
    UnauthorizedError,
    NotFoundError,
    RequestInProgressError,
    SuspectedDuplicateError,
    TransactionAbortedError,
    RequestExpiredError,
    PayloadTooLargeError,
    IdempotencyKeyReusedError,
    ValidationFailedError,
    PanNotAllowedError,
    ClockSkewError,
    AdviceTooOldError,
    NotReversibleError,
    RateLimitedError,
    InternalError,
    ServiceUnavailableError,
)

# Codes answered by the HTTP layer itself (routing, the ASGI limits), without a named error.
_TRANSPORT_TITLES = {
    "method_not_allowed": "Method not allowed",
    "request_timeout": "The request was not received in time; nothing was processed",
    "request_headers_too_large": "Request headers too large",
    "malformed_request": "Malformed HTTP request",
    "http_error": "HTTP error",
}
TITLES: dict[str, str] = {error.code: error.title for error in NAMED_ERRORS} | _TRANSPORT_TITLES


def unexpected(exc: BaseException, *, unavailable: str, internal: str) -> ApiError:
    """An exception no service named: storage down is 503 (retry-safe), anything else 500."""
    if storage_unavailable(exc):
        return ServiceUnavailableError(unavailable)
    return InternalError(internal)


def problem_body(status: int, code: str, detail: str, extra: dict[str, Any] | None = None) -> bytes:
    body: dict[str, Any] = {
        "type": f"urn:idempay:problem:{code}",
        "title": TITLES.get(code, code.replace("_", " ").capitalize()),
        "status": status,
        "detail": detail,
        "code": code,
    }
    if extra:
        body.update(extra)
    return json.dumps(body, separators=(",", ":")).encode()


def error_body(error: ApiError) -> bytes:
    return problem_body(error.status, error.code, error.detail, error.extra)


def with_retry_after(headers: dict[str, str], *, wanted: bool, seconds: int) -> dict[str, str]:
    """``headers`` plus ``Retry-After`` (from settings) when wanted and not already set."""
    if not wanted or "Retry-After" in headers:
        return dict(headers)
    return {**headers, "Retry-After": str(seconds)}


def problem_headers(error: ApiError, *, retry_after_seconds: int) -> dict[str, str]:
    """The error's own headers, plus ``Retry-After`` from settings when it asks for one."""
    return with_retry_after(error.headers, wanted=error.retry_after, seconds=retry_after_seconds)


def problem_response(error: ApiError, *, retry_after_seconds: int) -> Response:
    return Response(
        error_body(error),
        status_code=error.status,
        media_type=PROBLEM_JSON,
        headers=problem_headers(error, retry_after_seconds=retry_after_seconds),
    )
