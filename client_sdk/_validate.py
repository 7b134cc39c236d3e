"""Checking a create body against the server's rules (``_sale_rules``) before a sale is
accepted offline (contract §4.12): a sale the server can never accept must not become a
stored sale that is refused at every forward. The verdict is the server's own on every body
the SDK builds; ``tests/client_sdk/test_sale_rules.py`` compares the two on generated bodies.

``problems(body_json)`` lists what the server would refuse, each as ``{"loc", "msg"}`` (the
shape of the server's ``errors``); an empty list means the body is valid. ``refusal`` adds
the server's code for it (``validation_error``, or ``payload_too_large`` for a body over
its size limit).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from functools import cache
from typing import Any

from ._sale_rules import BODY_MAX_BYTES, CREATE_BODY

__all__ = ["problems", "refusal"]

Problem = dict[str, Any]
_MISSING = object()
_RFC3339 = re.compile(  # the form the SDK writes (``iso_utc``), any offset
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?(Z|[+-][0-9]{2}:[0-9]{2})"
)


@cache
def _pattern(text: str) -> re.Pattern[str]:
    return re.compile(text)


def _depth(value: Any) -> int:
    """Nesting depth of a decoded JSON value (a scalar is 0), as the server counts it."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict | list):
            level += 1
            deepest = max(deepest, level)
            stack.extend(
                (child, level) for child in (item.values() if isinstance(item, dict) else item)
            )
    return deepest


def _non_finite(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return True
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _timestamp(value: str) -> str | None:
    if not _RFC3339.fullmatch(value):
        return "must be an RFC 3339 date-time with an offset"
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return "is not a valid date-time"
    try:
        moment.astimezone(UTC)
    except OverflowError:
        return "out of range: not an instant between years 1 and 9999 in UTC"
    return None


def _integer(value: Any) -> int | None:
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def _check(rule: Mapping[str, Any], value: Any, loc: list[str]) -> list[Problem]:
    def problem(msg: str) -> list[Problem]:
        return [{"loc": loc, "msg": msg}]

    if value is None and rule.get("nullable"):
        return []
    if "enum" in rule:
        ok = isinstance(value, str) and value in rule["enum"]
        return [] if ok else problem(f"must be one of {rule['enum']}")
    kind = rule.get("type")
    if kind == "string":
        if not isinstance(value, str):
            return problem("must be a string")
        pattern = rule.get("pattern")
        if pattern is not None and not _pattern(pattern).fullmatch(value):
            return problem(f"must match {pattern}")
        return []
    if kind == "integer":
        number = _integer(value)
        if number is None:
            return problem("must be an integer")
        if number < rule.get("minimum", number) or number > rule.get("maximum", number):
            return problem(f"must be from {rule.get('minimum')} to {rule.get('maximum')}")
        return []
    if kind == "boolean":
        return [] if isinstance(value, bool) else problem("must be a boolean")
    if kind == "timestamp":
        if not isinstance(value, str):
            return problem("must be an RFC 3339 date-time string")
        wrong = _timestamp(value)
        return [] if wrong is None else problem(wrong)
    if kind == "object":
        if not isinstance(value, dict):
            return problem("must be an object")
        return _object(rule, value, loc)
    raise AssertionError(f"unknown rule {rule!r}")


def _object(rule: Mapping[str, Any], value: dict[str, Any], loc: list[str]) -> list[Problem]:
    found: list[Problem] = []
    properties: Mapping[str, Any] = rule.get("properties", {})
    for name in rule.get("required", ()):
        if name not in value:
            found.append({"loc": [*loc, name], "msg": "is required"})
    if rule.get("additional_properties") is False:
        for name in value:
            if name not in properties:
                found.append({"loc": [*loc, name], "msg": "is not a known field"})
    for name, inner in properties.items():
        if name in value:
            found.extend(_check(inner, value[name], [*loc, name]))
    if "max_depth" in rule and (depth := _depth(value)) > rule["max_depth"]:
        found.append({"loc": loc, "msg": f"is nested {depth} levels; at most {rule['max_depth']}"})
    elif "max_bytes" in rule:
        size = len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())
        if size > rule["max_bytes"]:
            found.append({"loc": loc, "msg": f"is {size} bytes; at most {rule['max_bytes']}"})
    for requirement in rule.get("requires", ()):
        when: Mapping[str, Any] = requirement["when"]
        if all(value.get(k, _MISSING) == v for k, v in when.items()):
            needed = requirement["then_present"]
            if value.get(needed) is None:
                found.append({"loc": [*loc, needed], "msg": f"is required when {when}"})
    return found


def problems(body_json: str) -> list[Problem]:
    """What the server would refuse in this create body (422 ``validation_error``, 413
    ``payload_too_large``); empty when it would accept it."""
    if len(body_json.encode()) > BODY_MAX_BYTES:
        return [{"loc": ["body"], "msg": f"is over {BODY_MAX_BYTES} bytes"}]
    try:
        body = json.loads(body_json)
    except ValueError:
        return [{"loc": ["body"], "msg": "is not valid JSON"}]
    if not isinstance(body, dict):
        return [{"loc": ["body"], "msg": "must be a JSON object"}]
    if _non_finite(body):
        return [{"loc": ["body"], "msg": "holds a non-finite number"}]
    return _check(CREATE_BODY, body, ["body"])


def refusal(body_json: str) -> tuple[str, list[Problem]] | None:
    """The server's code and the problems for a body it would refuse; None when valid."""
    if len(body_json.encode()) > BODY_MAX_BYTES:
        return "payload_too_large", problems(body_json)
    found = problems(body_json)
    return ("validation_error", found) if found else None
