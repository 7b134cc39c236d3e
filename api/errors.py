"""One status-coded error type, rendered by one handler as RFC 9457 problem+json."""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import Response

PROBLEM_JSON = "application/problem+json"

TITLES: dict[str, str] = {
    "idempotency_key_missing": "Idempotency-Key header is required",
    "idempotency_key_invalid": "Idempotency-Key is not a UUID",
    "unauthorized": "Missing or unknown API key",
    "not_found": "Not found",
    "method_not_allowed": "Method not allowed",
    "request_in_progress": "A request with this key is being processed",
    "transaction_aborted": "The key was fenced by an abort",
    "request_expired": "The request expired before it could be processed",
    "payload_too_large": "Request body too large",
    "idempotency_key_reused": "Idempotency-Key reused with a different request",
    "validation_error": "The request is invalid",
    "pan_not_allowed": "Card numbers must not be sent; use a card token",
    "clock_skew": "The request's time is too far ahead of the server's clock",
    "not_reversible": "The transaction cannot be reversed",
    "rate_limited": "Too many requests",
    "service_unavailable": "Storage unavailable; nothing was processed",
    "internal_error": "Internal error; nothing was stored under the key",
    "request_timeout": "The request was not received in time; nothing was processed",
    "request_headers_too_large": "Request headers too large",
    "malformed_request": "Malformed HTTP request",
    "http_error": "HTTP error",
}


class ApiError(Exception):
    """An error with an HTTP status and a stable machine-readable ``code``."""

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


def problem_response(error: ApiError) -> Response:
    return Response(
        problem_body(error.status, error.code, error.detail, error.extra),
        status_code=error.status,
        media_type=PROBLEM_JSON,
        headers=error.headers,
    )
