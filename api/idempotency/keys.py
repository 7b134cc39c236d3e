"""Idempotency-Key parsing and request fingerprints."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from api.errors import ApiError

_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def parse_key(raw: str | None) -> str:
    """The canonical (lower-case) UUID of an ``Idempotency-Key`` header.

    Accepts any UUID version in canonical 8-4-4-4-12 form, any case, bare or as an
    RFC 8941 quoted string (``"…"``), as the IETF draft writes it.
    """
    if raw is None or raw.strip() == "":
        raise ApiError(400, "idempotency_key_missing", "Send an Idempotency-Key header (a UUID).")
    return parse_uuid(raw.strip(), allow_quotes=True)


def parse_uuid(raw: str, *, allow_quotes: bool = False) -> str:
    value = raw
    if allow_quotes and len(value) >= 2 and value[0] == value[-1] == '"':
        value = value[1:-1]
    value = value.lower()
    if len(value) != 36 or not _UUID.fullmatch(value):
        raise ApiError(
            400,
            "idempotency_key_invalid",
            "The idempotency key must be a UUID in canonical form "
            "(xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx).",
        )
    return value


def fingerprint(canonical_body: dict[str, Any]) -> str:
    """sha256 of the canonical JSON body (validated, defaults applied, keys sorted)."""
    text = json.dumps(canonical_body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()
