"""Errors raised by the idempay SDK.

Every error carries ``code`` (the server's machine-readable problem code, when there is
one), ``status`` (HTTP status), ``request_id`` (the ``X-Request-Id`` response header) and
``detail``.

```
IdempayError
├── APIError                       the server answered with an error (problem+json)
│   ├── IdempotencyKeyMissing      400 idempotency_key_missing
│   ├── IdempotencyKeyInvalid      400 idempotency_key_invalid
│   ├── Unauthorized               401 unauthorized
│   ├── NotFound                   404 not_found
│   ├── RequestInProgress          409 request_in_progress
│   ├── TransactionAborted         410 transaction_aborted
│   ├── RequestExpired             410 request_expired
│   ├── PayloadTooLarge            413 payload_too_large
│   ├── IdempotencyKeyReused       422 idempotency_key_reused
│   ├── ValidationFailed           422 validation_error
│   │   └── PanNotAllowed          422 pan_not_allowed (also raised locally, before journaling)
│   ├── NotReversible              422 not_reversible
│   ├── RateLimited                429 rate_limited
│   └── ServerError                5xx
│       └── ServiceUnavailable     503 service_unavailable
├── APIConnectionError             no answer (network failure) after the allowed retries
├── PaymentAborted                 the payment is fenced: definitive, never charged
├── PaymentInDoubt                 no definitive answer recorded (``result`` if one arrived)
└── JournalError                   the local journal refused an operation
    └── InvalidTransition          a transition out of a terminal state (or back to PENDING)
```
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

__all__ = [
    "APIConnectionError",
    "APIError",
    "IdempayError",
    "IdempotencyKeyInvalid",
    "IdempotencyKeyMissing",
    "IdempotencyKeyReused",
    "InvalidTransition",
    "JournalError",
    "NotFound",
    "NotReversible",
    "PanNotAllowed",
    "PayloadTooLarge",
    "PaymentAborted",
    "PaymentInDoubt",
    "RateLimited",
    "RequestExpired",
    "RequestInProgress",
    "ServerError",
    "ServiceUnavailable",
    "TransactionAborted",
    "Unauthorized",
    "ValidationFailed",
    "error_from_response",
]


class IdempayError(Exception):
    """Base of every error the SDK raises."""

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        status: int | None = None,
        request_id: str | None = None,
        detail: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status
        self.request_id = request_id
        self.detail = detail


class APIError(IdempayError):
    """The server answered with an error status."""

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        status: int | None = None,
        request_id: str | None = None,
        detail: str | None = None,
        body: object = None,
    ) -> None:
        super().__init__(message, code=code, status=status, request_id=request_id, detail=detail)
        self.body = body


class IdempotencyKeyMissing(APIError):
    """The create carried no Idempotency-Key header."""


class IdempotencyKeyInvalid(APIError):
    """The Idempotency-Key header is not a UUID."""


class Unauthorized(APIError):
    """The API key is missing or unknown."""


class NotFound(APIError):
    """Nothing is known under this key (for this merchant)."""


class RequestInProgress(APIError):
    """The key is being processed right now; retry after Retry-After."""


class TransactionAborted(APIError):
    """The key was fenced by abort: never processed, and never will be."""


class RequestExpired(APIError):
    """The request arrived after its expires_at (or captured_at is too old): fenced."""


class PayloadTooLarge(APIError):
    """The request body is over the server's limit."""


class IdempotencyKeyReused(APIError):
    """The key was already used with a different payload."""


class ValidationFailed(APIError):
    """The request body is invalid."""


class PanNotAllowed(ValidationFailed):
    """A field looks like a card number (PAN); card data must be tokenized."""


class NotReversible(APIError):
    """The transaction cannot be reversed (declined, or aborted)."""


class RateLimited(APIError):
    """Too many requests for this API key; retry after Retry-After."""


class ServerError(APIError):
    """A 5xx: never the stored answer for a key, so a retry with the same key is safe."""


class ServiceUnavailable(ServerError):
    """Storage is down; nothing was processed by this request."""


class APIConnectionError(IdempayError):
    """No HTTP answer: the network failed (``sent`` tells whether the request may have left)."""

    def __init__(self, message: str, *, sent: bool) -> None:
        super().__init__(message)
        self.sent = sent


class PaymentAborted(IdempayError):
    """The payment ended without a charge: fenced by abort, expired, or never sent."""

    def __init__(
        self,
        message: str,
        *,
        key: str,
        reason: Literal["aborted", "expired", "not_sent"],
        code: str | None = None,
        status: int | None = None,
        request_id: str | None = None,
        detail: str | None = None,
    ) -> None:
        super().__init__(message, code=code, status=status, request_id=request_id, detail=detail)
        self.key = key
        self.reason = reason


class PaymentInDoubt(IdempayError):
    """No definitive answer the terminal could record — not even the abort reached the
    server, or the journal failed after a send; the entry stays for recover().

    ``result`` is the server's definitive answer when one arrived but could not be
    journaled: a ``Transaction`` (it *was* processed: do not charge again) or ``Fenced``."""

    def __init__(self, message: str, *, key: str, result: object = None) -> None:
        super().__init__(message)
        self.key = key
        self.result = result


class JournalError(IdempayError):
    """The local journal refused an operation."""


class InvalidTransition(JournalError):
    """A journal entry cannot move to the requested state (``entry``: as it stands)."""

    def __init__(self, message: str, *, entry: object = None) -> None:
        super().__init__(message)
        self.entry = entry


_BY_CODE: dict[str, type[APIError]] = {
    "idempotency_key_missing": IdempotencyKeyMissing,
    "idempotency_key_invalid": IdempotencyKeyInvalid,
    "unauthorized": Unauthorized,
    "not_found": NotFound,
    "request_in_progress": RequestInProgress,
    "transaction_aborted": TransactionAborted,
    "request_expired": RequestExpired,
    "payload_too_large": PayloadTooLarge,
    "idempotency_key_reused": IdempotencyKeyReused,
    "validation_error": ValidationFailed,
    "pan_not_allowed": PanNotAllowed,
    "not_reversible": NotReversible,
    "rate_limited": RateLimited,
    "service_unavailable": ServiceUnavailable,
}

_BY_STATUS: dict[int, type[APIError]] = {
    401: Unauthorized,
    404: NotFound,
    409: RequestInProgress,
    413: PayloadTooLarge,
    422: ValidationFailed,
    429: RateLimited,
    503: ServiceUnavailable,
}


def _error_class(status: int, code: str | None) -> type[APIError]:
    if code is not None and code in _BY_CODE:
        return _BY_CODE[code]
    if status in _BY_STATUS:
        return _BY_STATUS[status]
    return ServerError if status >= 500 else APIError


def error_from_response(status: int, headers: Mapping[str, str], body: object) -> APIError:
    """Build the typed error for an error response (pure: no I/O)."""
    problem = body if isinstance(body, dict) else {}
    raw_code = problem.get("code")
    code = raw_code if isinstance(raw_code, str) else None
    raw_detail = problem.get("detail")
    detail = raw_detail if isinstance(raw_detail, str) else None
    raw_title = problem.get("title")
    title = raw_title if isinstance(raw_title, str) else f"HTTP {status}"
    message = f"{status} {code or title}" + (f": {detail}" if detail else "")
    return _error_class(status, code)(
        message,
        code=code,
        status=status,
        request_id=headers.get("x-request-id"),
        detail=detail,
        body=body,
    )
