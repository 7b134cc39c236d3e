"""Idempotency-Key parsing and request fingerprints."""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel

from api.errors import IdempotencyKeyInvalidError, IdempotencyKeyMissingError
from api.jsonfast import compact

_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


_OWS = " \t"  # HTTP's optional whitespace (RFC 9110 §5.6.3); str.strip() would also eat NBSP


def parse_key(raw: str | None) -> str:
    """The canonical (lower-case) UUID of an ``Idempotency-Key`` header.

    Accepts any UUID version in canonical 8-4-4-4-12 form, any case, bare or as an
    RFC 8941 quoted string (``"…"``), as the IETF draft writes it.
    """
    value = None if raw is None else raw.strip(_OWS)
    if not value:
        raise IdempotencyKeyMissingError("Send an Idempotency-Key header (a UUID).")
    return parse_uuid(value, allow_quotes=True)


def parse_uuid(raw: str, *, allow_quotes: bool = False) -> str:
    value = raw
    if allow_quotes and len(value) >= 2 and value[0] == value[-1] == '"':
        value = value[1:-1]
    value = value.lower()
    if len(value) != 36 or not _UUID.fullmatch(value):
        raise IdempotencyKeyInvalidError(
            "The idempotency key must be a UUID in canonical form "
            "(xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx).",
        )
    return value


def fingerprint(canonical_body: dict[str, Any]) -> str:
    """sha256 of the canonical JSON body (validated, defaults applied, keys sorted)."""
    text = compact(canonical_body, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def body_fingerprint(body: BaseModel) -> str:
    return fingerprint(body.model_dump(mode="json"))


def uuid7_time(key: str) -> datetime | None:
    """When a UUIDv7 key was minted (its 48-bit Unix-ms prefix); None for other versions."""
    if len(key) != 36 or key[14] != "7":
        return None
    millis = int(key[:8] + key[9:13], 16)
    return datetime.fromtimestamp(millis / 1000, UTC)
