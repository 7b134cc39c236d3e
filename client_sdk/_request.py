"""Building the create body once, before the key is journaled.

The body is serialized exactly once; every attempt resends the journaled bytes, so the
server's payload fingerprint can never differ between attempts of one key. A body that
carries something that looks like a card number (12-19 digits passing Luhn anywhere in
it: a string, a number, a key — the server's own rule, ``_sale_rules.contains_pan``) is
refused locally so that a PAN is never written to the terminal's disk.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Literal

from ._exceptions import PanNotAllowedError
from ._models import Card
from ._sale_rules import contains_pan

__all__ = ["build_body", "contains_pan", "iso_utc"]

_CURRENCY = re.compile(r"[A-Z]{3}")


def iso_utc(moment: datetime) -> str:
    """RFC 3339 in UTC with a ``Z`` suffix, millisecond precision."""
    if moment.tzinfo is None:
        raise ValueError("datetimes must be timezone-aware")
    text = moment.astimezone(UTC).isoformat(timespec="milliseconds")
    return text.replace("+00:00", "Z")


def build_body(
    *,
    terminal_id: str,
    kind: Literal["purchase", "refund"],
    amount: int,
    currency: str,
    card: Card,
    installments: int | None,
    metadata: Mapping[str, Any] | None,
    captured_at: datetime,
    expires_at: datetime | None,
    allow_duplicate: bool = False,
) -> str:
    """The canonical JSON text of a create request. ``allow_duplicate`` adds
    ``"allow_duplicate": true`` (the cashier overrode the duplicate guard); the server
    leaves it out of the key's fingerprint, so it never makes a resend differ."""
    if not isinstance(amount, int) or isinstance(amount, bool) or amount < 1:
        raise ValueError("amount must be a positive integer of minor units")
    if not _CURRENCY.fullmatch(currency):
        raise ValueError("currency must be an ISO 4217 code (3 upper-case letters)")
    body: dict[str, Any] = {
        "terminal_id": terminal_id,
        "type": kind,
        "amount": amount,
        "currency": currency,
        "card": card.to_json(),
        "captured_at": iso_utc(captured_at),
    }
    if expires_at is not None:
        body["expires_at"] = iso_utc(expires_at)
    if installments is not None:
        body["installments"] = installments
    if metadata is not None:
        body["metadata"] = dict(metadata)
    if allow_duplicate:
        body["allow_duplicate"] = True
    if contains_pan(body):  # the server's own rule (``_sale_rules``): what it would refuse
        raise PanNotAllowedError(
            "pan_not_allowed: the request carries something that looks like a card number",
            code="pan_not_allowed",
            detail="card data must be tokenized; nothing was journaled or sent",
        )
    return json.dumps(body, separators=(",", ":"), sort_keys=True)
