"""Request-side helpers for the transaction routes: body reading, decoding, headers."""

from __future__ import annotations

import json
import math
from typing import Any

from pydantic import ValidationError
from starlette.requests import Request

from api.errors import PanNotAllowedError, PayloadTooLargeError, ValidationFailedError
from api.headers import parse_non_negative_int, parse_positive_int
from api.pan import contains_pan
from api.transactions.schemas import TransactionCreate

MAX_BODY_BYTES = 16 * 1024
NETWORKS = frozenset({"gprs", "3g", "4g", "wifi", "ethernet", "other"})


def _too_large() -> PayloadTooLargeError:
    # A new error each time: a shared one, raised again and again, would keep every refused
    # request's frames alive through its ever-growing __traceback__.
    return PayloadTooLargeError("The request body is over 16 KiB.")


async def read_body(request: Request) -> bytes:
    declared = parse_non_negative_int(request.headers.get("content-length"))
    if declared is not None and declared > MAX_BODY_BYTES:
        raise _too_large()
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise _too_large()
        chunks.append(chunk)
    return b"".join(chunks)


class _NonFinite:
    """A number JSON text can spell but not carry (``1e400``, ``NaN``, ``Infinity``)."""


class _Duplicated(dict[str, Any]):
    """An object in which a name appeared more than once (listed in ``names``)."""

    names: list[str]


def _number(text: str) -> Any:
    value = float(text)
    return value if math.isfinite(value) else _NonFinite()


def _constant(_text: str) -> Any:
    return _NonFinite()


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    decoded = dict(pairs)
    if len(decoded) == len(pairs):
        return decoded
    duplicated = _Duplicated(decoded)
    seen: set[str] = set()
    duplicated.names = []
    for name, _value in pairs:
        if name in seen and name not in duplicated.names:
            duplicated.names.append(name)
        seen.add(name)
    return duplicated


def _ambiguities(data: Any) -> list[dict[str, Any]]:
    """Duplicate object names and non-finite numbers, each named by its place in the body.
    Either would make the body mean something else than it says (the last duplicate wins in
    one parser, the first in another; infinity is not JSON and fingerprints like null)."""
    errors: list[dict[str, Any]] = []
    stack: list[tuple[Any, list[str | int]]] = [(data, [])]
    while stack:
        item, loc = stack.pop()
        if isinstance(item, _NonFinite):
            message = "must be a finite number"
            errors.append({"loc": loc, "msg": message, "type": "finite_number"})
        elif isinstance(item, dict):
            for name in getattr(item, "names", ()):
                message = f"{name!r} appears more than once in the object"
                errors.append({"loc": [*loc, name], "msg": message, "type": "duplicate_key"})
            stack.extend((value, [*loc, name]) for name, value in item.items())
        elif isinstance(item, list):
            stack.extend((value, [*loc, index]) for index, value in enumerate(item))
    return sorted(errors, key=lambda error: [str(part) for part in error["loc"]])


def _invalid(message: str, loc: list[str | int] | None = None) -> ValidationFailedError:
    return ValidationFailedError(
        message,
        extra={"errors": [{"loc": loc or ["body"], "msg": message, "type": "json_invalid"}]},
    )


def decode(raw: bytes) -> TransactionCreate:
    """JSON → PAN scan → unambiguous JSON → schema, in that order: a PAN is refused before
    anything echoes, and a body that means two things is refused before it is fingerprinted."""
    try:
        data = json.loads(
            raw, parse_float=_number, parse_constant=_constant, object_pairs_hook=_object
        )
    except (ValueError, RecursionError):
        raise _invalid("The body is not valid JSON.") from None
    if contains_pan(data):
        raise PanNotAllowedError(
            "A value in the body looks like a card number (PAN). Send a card token instead; "
            "the body was not stored or logged.",
        )
    if not isinstance(data, dict):
        raise _invalid("The body must be a JSON object.")
    if ambiguities := _ambiguities(data):
        raise ValidationFailedError(
            "The body has duplicate names or non-finite numbers; see errors.",
            extra={"errors": ambiguities},
        )
    try:
        return TransactionCreate.model_validate(data)
    except ValidationError as exc:
        errors = [
            {"loc": list(err["loc"]), "msg": err["msg"], "type": err["type"]}
            for err in exc.errors(include_url=False, include_input=False, include_context=False)
        ]
        raise ValidationFailedError(
            "The body is invalid; see errors.", extra={"errors": errors}
        ) from None


def attempt_header(request: Request) -> int | None:
    """``Idempotency-Attempt`` is telemetry: an unusable value is recorded as unknown."""
    return parse_positive_int(request.headers.get("idempotency-attempt"), max_digits=6)


def network_header(request: Request) -> str | None:
    raw = request.headers.get("pos-network")
    if raw is None:
        return None
    value = raw.strip().lower()
    return value if value in NETWORKS else "other"
