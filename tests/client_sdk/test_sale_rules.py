"""One table of create-body rules, two readers: the server's pydantic schema (through its
generated copy, ``api/sale_rules.py``) and the SDK's offline check
(``client_sdk._validate``). The copy must be the generated one, and both must give the same
verdict on every body — checked here on generated bodies against the server's own decoder
(``api.transactions.http.decode``: JSON, PAN scan, ambiguities, schema)."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import client_sdk._sale_rules as sdk_rules
from api.errors import PanNotAllowedError, ValidationFailedError
from api.pan import contains_pan
from api.transactions import http
from client_sdk._request import iso_utc
from client_sdk._validate import problems

ROOT = Path(__file__).resolve().parents[2]


def test_the_servers_copy_of_the_rules_is_the_generated_one() -> None:
    source = Path(sdk_rules.__file__).read_text(encoding="utf-8")
    copy = (ROOT / "api" / "sale_rules.py").read_text(encoding="utf-8")
    assert copy == sdk_rules.generated_copy(source), (
        "api/sale_rules.py is stale: run python -m client_sdk._sale_rules > api/sale_rules.py"
    )
    assert http.MAX_BODY_BYTES == sdk_rules.BODY_MAX_BYTES


def server_accepts(text: str) -> bool:
    raw = text.encode()
    if len(raw) > http.MAX_BODY_BYTES:
        return False  # 413 payload_too_large
    try:
        http.decode(raw)
    except PanNotAllowedError:
        raise AssertionError("the corpus holds no PANs") from None
    except ValidationFailedError:
        return False
    return True


VALID: dict[str, Any] = {
    "terminal_id": "T-0001",
    "type": "purchase",
    "amount": 1250,
    "currency": "BRL",
    "card": {"token": "tok_visa_4242", "last4": "4242", "brand": "visa"},
    "captured_at": "2026-11-28T10:00:00.000Z",
    "expires_at": "2026-11-28T10:01:00.000Z",
}


@pytest.mark.parametrize(
    ("change", "valid"),
    [
        ({}, True),
        ({"card": {**VALID["card"], "brand": "Visa"}}, False),
        ({"installments": 25}, False),
        ({"installments": 24}, True),
        ({"installments": 3.0}, True),
        ({"metadata": {"note": "x" * 5 * 1024}}, False),
        ({"metadata": {"note": "x" * 4000}}, True),
        ({"terminal_id": "T-0001\n"}, False),
        ({"amount": True}, False),
        ({"amount": 10**12 + 1}, False),
        ({"entry_mode": "offline"}, True),
        ({"entry_mode": "offline", "captured_at": None}, False),
        ({"captured_at": "0001-01-01T00:00:00+14:00"}, False),
        ({"captured_at": "2026-02-30T00:00:00Z"}, False),
        ({"metadata": {"n": float("inf")}}, False),
        ({"surprise": 1}, False),
    ],
)
def test_the_issues_bodies_get_the_servers_verdict(change: dict[str, Any], valid: bool) -> None:
    text = json.dumps({**VALID, **change}, separators=(",", ":"), sort_keys=True)
    assert server_accepts(text) is valid
    assert (problems(text) == []) is valid, problems(text)


def pick(*choices: Any) -> st.SearchStrategy[Any]:
    return st.sampled_from(choices)


MISSING = object()
printable = st.characters(codec="utf-8", exclude_categories=("Cs",))
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(10**6), 10**6)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(printable, max_size=40)
)
metadata = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=40,
)


def deep(levels: int) -> Any:
    value: Any = "x"
    for _ in range(levels):
        value = {"k": value}
    return value


moments = st.datetimes(  # instants the SDK can write (iso_utc: in UTC, years 1-9999)
    min_value=datetime(2, 1, 1), max_value=datetime(9998, 12, 31), timezones=st.timezones()
)
timestamps = st.one_of(
    moments.map(iso_utc),
    st.none(),
    pick(
        "0001-01-01T00:00:00+14:00",
        "9999-12-31T23:59:59-14:00",
        "2026-11-28T10:00:00+05:30",
        "2026-11-28T10:00:00.123456Z",
        "2026-02-30T00:00:00Z",
        "2026-11-28T10:00:00",
        1_795_000_000,
    ),
)
integers_ish = st.one_of(
    st.integers(-3, 30),
    st.integers(10**12 - 2, 10**12 + 2),
    pick(1.0, 24.0, 25.0, 12.5, 1e20, True, False, "3", None),
)


# Each field's values, built once (strategies built inside ``bodies`` were validated again at
# every draw); ``bodies`` draws only the fields the body it makes holds.
FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "terminal_id": st.one_of(
        st.from_regex(r"[A-Za-z0-9_.\-]{1,64}", fullmatch=True),
        st.text(max_size=70),
        pick("", "T" * 65, "T-1\n", 7),
    ),
    "type": pick("purchase", "refund", "PURCHASE", None, 1),
    "amount": integers_ish,
    "currency": st.one_of(pick("BRL", "USD", "brl", "BR", "BRLX", 986), st.text(max_size=4)),
    "card": st.one_of(
        st.fixed_dictionaries(
            {
                "token": st.one_of(
                    st.from_regex(r"tok_[A-Za-z0-9_]{1,130}", fullmatch=True),
                    pick("tok_", "card_x", "tok_a-b"),
                ),
                "last4": st.one_of(pick("4242", "424", "42a2", 4242, "４２４２")),
                "brand": st.one_of(
                    st.from_regex(r"[a-zA-Z][a-z0-9_]{0,33}", fullmatch=True),
                    pick("Visa", "visa", "v" * 33, "_visa"),
                ),
            },
            optional={"cvv": pick("123")},
        ),
        pick(None, "tok_visa", {"token": "tok_x", "last4": "4242"}),
    ),
    "installments": integers_ish,
    "captured_at": timestamps,
    "expires_at": timestamps,
    "metadata": st.one_of(
        st.dictionaries(st.text(max_size=8), metadata, max_size=4),
        st.builds(lambda n: {"note": "é" * n}, st.integers(2000, 2100)),
        st.builds(lambda n: {"deep": deep(n)}, st.integers(13, 17)),
        pick([], "notes", None),
    ),
    "entry_mode": pick("online", "offline", "OFFLINE", None),
    "allow_duplicate": pick(True, False, "true", 1),
    "extra": pick(1),
}
NAMES = sorted(FIELDS)


@st.composite
def bodies(draw: st.DrawFn) -> dict[str, Any]:
    if draw(st.booleans()):  # one field changed from a valid body (or dropped)
        name = draw(st.sampled_from(NAMES))
        if draw(st.booleans()) and name != "extra":
            return {field: value for field, value in VALID.items() if field != name}
        return {**VALID, name: draw(FIELDS[name])}
    present = draw(st.sets(st.sampled_from(NAMES)))
    if draw(st.booleans()):
        present |= {"terminal_id", "amount", "currency", "card"}
    return {name: draw(FIELDS[name]) for name in NAMES if name in present}


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=bodies())
def test_the_sdk_and_the_server_agree_on_generated_bodies(body: dict[str, Any]) -> None:
    assume(not contains_pan(body))
    text = json.dumps(body, separators=(",", ":"), sort_keys=True)
    assert (problems(text) == []) is server_accepts(text), (text[:400], problems(text))


@settings(max_examples=200, deadline=None)
@given(
    amount=st.integers(1, 10**12),
    installments=st.integers(1, 24),
    terminal=st.from_regex(r"[A-Za-z0-9_.\-]{1,64}", fullmatch=True),
    captured=moments,
)
def test_valid_bodies_are_valid_for_both(
    amount: int, installments: int, terminal: str, captured: Any
) -> None:
    body = {**VALID, "amount": amount, "installments": installments, "terminal_id": terminal}
    body["captured_at"] = iso_utc(captured)
    assume(not contains_pan(body))
    text = json.dumps(body, separators=(",", ":"), sort_keys=True)
    assert problems(text) == [] and server_accepts(text)
