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


def _string_has_pan(text: str) -> bool:
    for match in _PAN_CANDIDATE.finditer(text):
        digits = re.sub(r"[ -]", "", match.group())
        if 12 <= len(digits) <= 19 and luhn_ok(digits):
            return True
    return False


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
