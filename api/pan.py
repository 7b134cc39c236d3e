"""Find card numbers (PANs) anywhere in a decoded JSON body, before anything is stored.

The rule itself — what a card number looks like — is the sale rules' (``sale_rules``,
generated from the terminal SDK's table), so the SDK refuses offline exactly what the server
refuses online; this module adds the log redaction built on it."""

from __future__ import annotations

import re

from api.sale_rules import (
    PAN_CANDIDATE,
    contains_pan,
    luhn_ok,
    pan_digits,
    without_uuids,
)

__all__ = ["contains_pan", "luhn_ok", "redact_pans"]


def redact_pans(text: str, replacement: str = "[pan]") -> str:
    """``text`` with every PAN-looking run (as ``contains_pan`` finds them) replaced."""

    def one(match: re.Match[str]) -> str:
        return replacement if luhn_ok(pan_digits(match.group())) else match.group()

    masked = without_uuids(text)
    if masked is text:
        return PAN_CANDIDATE.sub(one, text)
    parts, last = [], 0  # replace only runs found outside UUIDs, in the original text
    for match in PAN_CANDIDATE.finditer(masked):
        parts += [text[last : match.start()], one(match)]
        last = match.end()
    return "".join([*parts, text[last:]])
