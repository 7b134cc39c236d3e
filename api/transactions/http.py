"""Request-side helpers for the transaction routes: body reading, decoding, headers."""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError
from starlette.requests import Request

from api.errors import ApiError
from api.transactions.pan import contains_pan
from api.transactions.schemas import TransactionCreate

MAX_BODY_BYTES = 16 * 1024
NETWORKS = frozenset({"gprs", "3g", "4g", "wifi", "ethernet", "other"})

_TOO_LARGE = ApiError(413, "payload_too_large", "The request body is over 16 KiB.")


async def read_body(request: Request) -> bytes:
    declared = request.headers.get("content-length", "")
    if declared.isascii() and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise _TOO_LARGE
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise _TOO_LARGE
        chunks.append(chunk)
    return b"".join(chunks)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _invalid(message: str, loc: list[str | int] | None = None) -> ApiError:
    return ApiError(
        422,
        "validation_error",
        message,
        extra={"errors": [{"loc": loc or ["body"], "msg": message, "type": "json_invalid"}]},
    )


def decode(raw: bytes) -> TransactionCreate:
    """JSON → PAN scan → schema, in that order: a PAN is refused before anything echoes."""
    try:
        data = json.loads(raw, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        raise _invalid("The body is not valid JSON.") from None
    if contains_pan(data):
        raise ApiError(
            422,
            "pan_not_allowed",
            "A value in the body looks like a card number (PAN). Send a card token instead; "
            "the body was not stored or logged.",
        )
    if not isinstance(data, dict):
        raise _invalid("The body must be a JSON object.")
    try:
        return TransactionCreate.model_validate(data)
    except ValidationError as exc:
        errors = [
            {"loc": list(err["loc"]), "msg": err["msg"], "type": err["type"]}
            for err in exc.errors(include_url=False, include_input=False, include_context=False)
        ]
        raise ApiError(
            422, "validation_error", "The body is invalid; see errors.", extra={"errors": errors}
        ) from None


def attempt_header(request: Request) -> int | None:
    """``Idempotency-Attempt`` is telemetry: an unusable value is recorded as unknown."""
    raw = request.headers.get("idempotency-attempt", "")
    # isascii: str.isdigit() is also true for "¹²³" (latin-1 0xB9, 0xB2, 0xB3), which int()
    # refuses; that once turned a telemetry header into a 500.
    if raw.isascii() and raw.isdigit() and len(raw) <= 6 and int(raw) >= 1:
        return int(raw)
    return None


def network_header(request: Request) -> str | None:
    raw = request.headers.get("pos-network")
    if raw is None:
        return None
    value = raw.strip().lower()
    return value if value in NETWORKS else "other"
