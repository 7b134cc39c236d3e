"""Find card numbers (PANs) anywhere in a decoded JSON body, before anything is stored."""

from __future__ import annotations

import re
from typing import Any

# 12–19 digits, optionally grouped by single spaces or dashes, not part of a longer digit run.
_PAN_CANDIDATE = re.compile(r"(?<!\d)(?<!\d[ -])\d(?:[ -]?\d){11,18}(?![ -]?\d)")


def luhn_ok(digits: str) -> bool:
    total = 0
    for index, char in enumerate(reversed(digits)):
        value = ord(char) - 48
        if index % 2:
            value *= 2
            if value > 9:
                value -= 9
        total += value
    return total % 10 == 0


# A canonical UUID is an identifier (order ids, the idempotency key itself), never a card
# number, but its hex groups hold digit runs that pass Luhn about 0.35 % of the time: blank
# UUIDs out before looking (a UUID can hide at most 12 consecutive digits).
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.I)


def _without_uuids(text: str) -> str:
    return _UUID.sub(lambda m: "u" * len(m.group()), text) if "-" in text else text


def _string_has_pan(text: str) -> bool:
    for match in _PAN_CANDIDATE.finditer(_without_uuids(text)):
        digits = re.sub(r"[ -]", "", match.group())
        if 12 <= len(digits) <= 19 and luhn_ok(digits):
            return True
    return False


def redact_pans(text: str, replacement: str = "[pan]") -> str:
    """``text`` with every PAN-looking run (as ``contains_pan`` finds them) replaced."""

    def one(match: re.Match[str]) -> str:
        digits = re.sub(r"[ -]", "", match.group())
        return replacement if luhn_ok(digits) else match.group()

    masked = _without_uuids(text)
    if masked is text:
        return _PAN_CANDIDATE.sub(one, text)
    parts, last = [], 0  # replace only runs found outside UUIDs, in the original text
    for match in _PAN_CANDIDATE.finditer(masked):
        parts += [text[last : match.start()], one(match)]
        last = match.end()
    return "".join([*parts, text[last:]])


def contains_pan(value: Any) -> bool:
    """True when any string, number or object key in ``value`` looks like a card number."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if _string_has_pan(item):
                return True
        elif isinstance(item, bool):
            continue
        elif isinstance(item, int):
            if _string_has_pan(str(abs(item))):
                return True
        elif isinstance(item, float):
            if _string_has_pan(repr(item)):
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False
