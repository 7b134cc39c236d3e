"""Errors raised by the idempay SDK.

Every error carries ``code`` (the server's machine-readable problem code, when there is
one), ``status`` (HTTP status), ``request_id`` (the ``X-Request-Id`` response header) and
``detail``.

```
IdempayError
├── APIError                            the server answered with an error (problem+json)
│   ├── IdempotencyKeyMissingError      400 idempotency_key_missing
│   ├── IdempotencyKeyInvalidError      400 idempotency_key_invalid
│   ├── UnauthorizedError               401 unauthorized
│   ├── NotFoundError                   404 not_found
│   ├── RequestTimeoutError             408 request_timeout
│   ├── RequestInProgressError          409 request_in_progress
│   ├── DuplicateGuardError             409 suspected_duplicate (a payment: SuspectedDuplicateError)
│   ├── TransactionAbortedError         410 transaction_aborted
│   ├── RequestExpiredError             410 request_expired
│   ├── PayloadTooLargeError            413 payload_too_large
│   ├── IdempotencyKeyReusedError       422 idempotency_key_reused
│   ├── ValidationFailedError           422 validation_error
│   │   ├── PanNotAllowedError          422 pan_not_allowed (also raised locally, before journaling)
│   │   └── ClockSkewError              422 clock_skew
│   ├── AdviceTooOldError               422 advice_too_old (a forwarded offline payment)
│   ├── NotReversibleError              422 not_reversible
│   ├── RateLimitedError                429 rate_limited
│   └── ServerError                     5xx (internal_error, or no code)
│       └── ServiceUnavailableError     503 service_unavailable
├── APIConnectionError                  no answer (network failure) after the allowed retries
├── PaymentAbortedError                 the payment is fenced: definitive, never charged
│   ├── OfflineLimitError               not accepted offline: a limit of the OfflinePolicy
│   └── SuspectedDuplicateError         refused by the duplicate guard (``duplicate_of``), fenced
├── PaymentInDoubtError                 no definitive answer recorded (``result`` if one arrived)
├── StoredPaymentError                  the key is a payment sold offline: never aborted
│   └── StoredPaymentOverdueError       stored longer than max_age_s, still not forwarded
└── JournalError                        the local journal refused an operation
    └── InvalidTransitionError          a transition out of a terminal state (or back to PENDING)
```

A code the SDK does not know (``method_not_allowed``, ``malformed_request``,
``request_headers_too_large``, or one a newer server adds) keeps its ``code`` on the class
its status maps to, else on ``APIError`` (``ServerError`` for a 5xx).

Deprecated names, kept for one release as aliases of the same class objects (so
``except PaymentAborted`` still catches ``PaymentAbortedError``): ``IdempotencyKeyMissing``,
``IdempotencyKeyInvalid``, ``Unauthorized``, ``NotFound``, ``RequestInProgress``,
``TransactionAborted``, ``RequestExpired``, ``PayloadTooLarge``, ``IdempotencyKeyReused``,
``ValidationFailed``, ``PanNotAllowed``, ``NotReversible``, ``RateLimited``,
``ServiceUnavailable``, ``PaymentAborted``, ``PaymentInDoubt``, ``InvalidTransition``.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Literal

__all__ = [
    "APIConnectionError",
    "APIError",
    "AdviceTooOldError",
    "ClockSkewError",
    "DuplicateGuardError",
    "ERRORS_BY_CODE",
    "IdempayError",
    "IdempotencyKeyInvalid",
    "IdempotencyKeyInvalidError",
    "IdempotencyKeyMissing",
    "IdempotencyKeyMissingError",
    "IdempotencyKeyReused",
    "IdempotencyKeyReusedError",
    "InvalidTransition",
    "InvalidTransitionError",
    "JournalError",
    "NotFound",
    "NotFoundError",
    "NotReversible",
    "NotReversibleError",
    "OfflineLimitError",
    "PanNotAllowed",
    "PanNotAllowedError",
    "PayloadTooLarge",
    "PayloadTooLargeError",
    "PaymentAborted",
    "PaymentAbortedError",
    "PaymentInDoubt",
    "PaymentInDoubtError",
    "RateLimited",
    "RateLimitedError",
    "RequestExpired",
    "RequestExpiredError",
    "RequestInProgress",
    "RequestInProgressError",
    "RequestTimeoutError",
    "ServerError",
    "ServiceUnavailable",
    "ServiceUnavailableError",
    "StoredPaymentError",
    "StoredPaymentOverdueError",
    "SuspectedDuplicateError",
    "TransactionAborted",
    "TransactionAbortedError",
    "Unauthorized",
    "UnauthorizedError",
    "ValidationFailed",
    "ValidationFailedError",
    "error_from_response",
]


class IdempayError(Exception):
    """Base of every error the SDK raises.

    ``message`` is the text of ``str(error)``; ``code``, ``status``, ``request_id`` and
    ``detail`` are the server's problem code, HTTP status, ``X-Request-Id`` and problem
    ``detail`` when the error comes from an answer (else None)."""

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
    """The server answered with an error status; ``body`` is the parsed answer (the
    problem+json object, or None when it was not JSON)."""

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


class IdempotencyKeyMissingError(APIError):
    """The create carried no Idempotency-Key header."""


class IdempotencyKeyInvalidError(APIError):
    """The Idempotency-Key header is not a UUID."""


class UnauthorizedError(APIError):
    """The server does not accept the client's ``api_key`` (unknown, revoked or empty).

    ``str(error)`` names the key the client was given by its first 8 characters (what
    ``idempay admin list-keys`` shows), never the whole key; ``detail`` is the server's."""

    def _name_key(self, api_key: str) -> None:
        """Say which ``api_key`` was refused (called by the client that was given it)."""
        status = self.status if self.status is not None else 401
        self.message = _unauthorized_message(status, _key_label(api_key))
        self.args = (self.message,)


# What ``idempay admin list-keys`` shows of a key; an API key is 47 characters.
_SHOWN_KEY_CHARS = 8


def _key_label(api_key: str) -> str:
    if not api_key:
        return "an empty string"
    if len(api_key) < 2 * _SHOWN_KEY_CHARS:
        return f"{len(api_key)} characters long: not a whole key"
    return f"{api_key[:_SHOWN_KEY_CHARS]}…"


def _unauthorized_message(status: int, label: str | None = None) -> str:
    given = "the api_key this client was given" + (f" ({label})" if label else "")
    return (
        f"{status} unauthorized: the server does not accept {given}: it is unknown to this "
        "server, revoked, or empty. Pass the merchant's current API key as the client's "
        "api_key (`idempay admin list-keys` shows each key's first 8 characters; "
        "`idempay admin create-key` makes one)."
    )


class NotFoundError(APIError):
    """Nothing is known under this key (for this merchant)."""


class RequestTimeoutError(APIError):
    """The request body did not reach the server in time; nothing was processed."""


class RequestInProgressError(APIError):
    """The key is being processed right now; retry after Retry-After."""


class DuplicateGuardError(APIError):
    """The merchant's duplicate guard refused a create (409 ``suspected_duplicate``): an
    approved purchase of the same card, amount and terminal under another key within the
    window (``duplicate_of``: its id, or None when the answer did not say); nothing was
    stored under the key. A payment does not report it as such: it fences the key first and
    raises ``SuspectedDuplicateError`` (with this error as its ``__cause__``)."""

    @property
    def duplicate_of(self) -> str | None:
        """The id of the earlier approved purchase, from the problem's ``duplicate_of``."""
        found = self.body.get("duplicate_of") if isinstance(self.body, Mapping) else None
        return found if isinstance(found, str) else None


class TransactionAbortedError(APIError):
    """The key was fenced by abort: never processed, and never will be."""


class RequestExpiredError(APIError):
    """The request arrived after its expires_at (or captured_at is too old): fenced."""


class PayloadTooLargeError(APIError):
    """The request body is over the server's limit."""


class IdempotencyKeyReusedError(APIError):
    """The key was already used with a different payload."""


class ValidationFailedError(APIError):
    """The request body is invalid."""


class PanNotAllowedError(ValidationFailedError):
    """A field looks like a card number (PAN); card data must be tokenized."""


class ClockSkewError(ValidationFailedError):
    """``captured_at`` (or the key's time) is further ahead of the server's clock than it
    tolerates; nothing was processed. A payment does not report it as such: it fences the
    key first (a copy of the attempt would be accepted once the server's clock catches up)
    and raises ``PaymentAbortedError`` with ``code == "clock_skew"``."""


class AdviceTooOldError(APIError):
    """A forwarded offline payment (an advice) was captured longer ago than the server's
    retention window: it is never processed and nothing was stored. The journal keeps it
    ``REPORTED`` for the merchant to reconcile."""


class NotReversibleError(APIError):
    """The transaction cannot be reversed (declined, or aborted)."""


class RateLimitedError(APIError):
    """Too many requests for this API key; retry after Retry-After."""


class ServerError(APIError):
    """A 5xx: never the stored answer for a key, so a retry with the same key is safe."""


class ServiceUnavailableError(ServerError):
    """Storage is down; nothing was processed by this request."""


class APIConnectionError(IdempayError):
    """No HTTP answer: the network failed (``sent`` tells whether the request may have left)."""

    def __init__(self, message: str, *, sent: bool) -> None:
        super().__init__(message)
        self.sent = sent


class PaymentAbortedError(IdempayError):
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


class OfflineLimitError(PaymentAbortedError):
    """The server could not be reached and the payment was not accepted offline: it would
    break ``limit`` of the ``OfflinePolicy`` (``floor_limit``, ``max_stored_count``,
    ``max_stored_amount``, ``max_age_s`` — a stored payment is overdue —, or
    ``purchase_only``). Nothing was sent; never charged."""

    def __init__(self, message: str, *, key: str, limit: str) -> None:
        super().__init__(message, key=key, reason="not_sent", code="offline_limit")
        self.limit = limit


class SuspectedDuplicateError(PaymentAbortedError):
    """The merchant's duplicate guard refused the payment as a likely repeat of the approved
    transaction ``duplicate_of`` (409 ``suspected_duplicate``), and the SDK fenced ``key``:
    definitive, never charged — a late copy of an earlier attempt is refused from now on.
    ``code`` is ``"suspected_duplicate"``, ``status`` 409. If the cashier confirms it is a
    new sale, call ``purchase(..., allow_duplicate=True)``: a new payment under a new key.
    A ``PaymentAbortedError``, so ``except PaymentAbortedError`` still catches it."""

    def __init__(
        self,
        message: str,
        *,
        key: str,
        duplicate_of: str | None,
        request_id: str | None = None,
        detail: str | None = None,
    ) -> None:
        super().__init__(
            message,
            key=key,
            reason="aborted",
            code="suspected_duplicate",
            status=409,
            request_id=request_id,
            detail=detail,
        )
        self.duplicate_of = duplicate_of


class StoredPaymentError(IdempayError):
    """``key`` is a payment the terminal accepted offline (journal state STORED): the
    customer has the goods, so the SDK never aborts it; it is forwarded instead."""

    def __init__(self, message: str, *, key: str) -> None:
        super().__init__(message)
        self.key = key


class StoredPaymentOverdueError(StoredPaymentError):
    """A payment stored offline more than ``max_age_s`` ago still could not be forwarded;
    it stays STORED (and is forwarded as soon as the server answers) — reported, never
    dropped. ``age_s``: seconds since it was captured."""

    def __init__(self, message: str, *, key: str, age_s: float) -> None:
        super().__init__(message, key=key)
        self.age_s = age_s


class PaymentInDoubtError(IdempayError):
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


class InvalidTransitionError(JournalError):
    """A journal entry cannot move to the requested state (``entry``: as it stands)."""

    def __init__(self, message: str, *, entry: object = None) -> None:
        super().__init__(message)
        self.entry = entry


_BY_CODE: dict[str, type[APIError]] = {
    "idempotency_key_missing": IdempotencyKeyMissingError,
    "idempotency_key_invalid": IdempotencyKeyInvalidError,
    "unauthorized": UnauthorizedError,
    "not_found": NotFoundError,
    "request_timeout": RequestTimeoutError,
    "request_in_progress": RequestInProgressError,
    "suspected_duplicate": DuplicateGuardError,
    "transaction_aborted": TransactionAbortedError,
    "request_expired": RequestExpiredError,
    "payload_too_large": PayloadTooLargeError,
    "idempotency_key_reused": IdempotencyKeyReusedError,
    "validation_error": ValidationFailedError,
    "pan_not_allowed": PanNotAllowedError,
    "clock_skew": ClockSkewError,
    "advice_too_old": AdviceTooOldError,
    "not_reversible": NotReversibleError,
    "rate_limited": RateLimitedError,
    "service_unavailable": ServiceUnavailableError,
}

ERRORS_BY_CODE: Mapping[str, type[APIError]] = MappingProxyType(_BY_CODE)
"""The server's problem codes the SDK raises a specific error for (read-only)."""

_BY_STATUS: dict[int, type[APIError]] = {
    401: UnauthorizedError,
    404: NotFoundError,
    408: RequestTimeoutError,
    409: RequestInProgressError,
    413: PayloadTooLargeError,
    422: ValidationFailedError,
    429: RateLimitedError,
    503: ServiceUnavailableError,
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
    error_class = _error_class(status, code)
    if error_class is UnauthorizedError:
        # the server's detail speaks HTTP ("Send Authorization: …"); an SDK user set api_key
        message = _unauthorized_message(status)
    else:
        message = f"{status} {code or title}" + (f": {detail}" if detail else "")
    return error_class(
        message,
        code=code,
        status=status,
        request_id=headers.get("x-request-id"),
        detail=detail,
        body=body,
    )


# Deprecated names (the same class objects), kept for one release.
IdempotencyKeyMissing = IdempotencyKeyMissingError
IdempotencyKeyInvalid = IdempotencyKeyInvalidError
Unauthorized = UnauthorizedError
NotFound = NotFoundError
RequestInProgress = RequestInProgressError
TransactionAborted = TransactionAbortedError
RequestExpired = RequestExpiredError
PayloadTooLarge = PayloadTooLargeError
IdempotencyKeyReused = IdempotencyKeyReusedError
ValidationFailed = ValidationFailedError
PanNotAllowed = PanNotAllowedError
NotReversible = NotReversibleError
RateLimited = RateLimitedError
ServiceUnavailable = ServiceUnavailableError
PaymentAborted = PaymentAbortedError
PaymentInDoubt = PaymentInDoubtError
InvalidTransition = InvalidTransitionError
