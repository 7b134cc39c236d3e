"""The pyiso8583 spec: every message type round-trips, every field is documented, and the
currency table is ISO 4217's numeric codes."""

from __future__ import annotations

import re

import iso8583
import pytest

from api.acquirer import spec
from api.acquirer.spec import (
    CURRENCY_NUMERIC,
    SPEC,
    UnsupportedCurrency,
    currency_alpha,
    currency_numeric,
)

COMMON = {"3": "000000", "4": "000000001250", "7": "1120120001", "11": "000042"}
IDS = {"37": "0A1B2C3D4E5F", "41": "ABCDEFGH", "42": "ABCDEFGHIJKLMNO", "49": "986"}
ORIGINAL = {"90": "0200000041112012000000000000000000000000000"[:42]}
MESSAGES = {
    "0200": COMMON | IDS | {"12": "120000", "13": "1120", "48": "M=m;T=t;K=tok_visa"},
    "0210": COMMON | IDS | {"38": "A1B2C3", "39": "00"},
    "0400": COMMON | IDS | ORIGINAL | {"48": "M=m;T=t;K="},
    "0410": COMMON | IDS | ORIGINAL | {"39": "00"},
    "0420": COMMON | IDS | ORIGINAL | {"48": "M=m;T=t;K="},
    "0421": COMMON | IDS | ORIGINAL | {"48": "M=m;T=t;K="},
    "0430": COMMON | IDS | ORIGINAL | {"39": "00"},
    "0800": {"7": "1120120001", "11": "000001", "70": "001"},
    "0810": {"7": "1120120001", "11": "000001", "39": "00", "70": "001"},
}


@pytest.mark.parametrize("mti", list(MESSAGES))
def test_every_message_type_round_trips(mti: str) -> None:
    fields = {"t": mti} | MESSAGES[mti]
    encoded, _ = iso8583.encode(dict(fields), SPEC)
    decoded, _ = iso8583.decode(encoded, SPEC)
    decoded.pop("p")
    decoded.pop("1", None)
    assert decoded == fields


def test_secondary_bitmap_only_when_a_field_past_64_is_present() -> None:
    encoded, _ = iso8583.encode({"t": "0200"} | MESSAGES["0200"], SPEC)
    assert "1" not in iso8583.decode(encoded, SPEC)[0]
    encoded, _ = iso8583.encode({"t": "0800"} | MESSAGES["0800"], SPEC)
    assert "1" in iso8583.decode(encoded, SPEC)[0]


def test_a_field_outside_the_spec_does_not_decode() -> None:
    encoded, _ = iso8583.encode({"t": "0800"} | MESSAGES["0800"], SPEC)
    tampered = encoded[:4] + b"C" + encoded[5:]  # primary bitmap now also names field 2
    with pytest.raises((iso8583.DecodeError, KeyError)):
        iso8583.decode(bytes(tampered), SPEC)


def test_every_field_of_the_spec_is_in_the_documented_table() -> None:
    doc = spec.__doc__ or ""
    documented = set(re.findall(r"^(\w+)\s{2,}", doc, flags=re.MULTILINE))
    assert set(SPEC) - {"h"} <= documented


@pytest.mark.parametrize(
    ("alpha", "numeric"),
    [("BRL", "986"), ("USD", "840"), ("EUR", "978"), ("GBP", "826"), ("ARS", "032"),
     ("MXN", "484"), ("CLP", "152"), ("COP", "170"), ("PEN", "604"), ("JPY", "392")],
)  # fmt: skip
def test_currencies_map_both_ways(alpha: str, numeric: str) -> None:
    assert currency_numeric(alpha) == numeric
    assert currency_alpha(numeric) == alpha


def test_currency_table_is_one_to_one_three_digits() -> None:
    assert len(set(CURRENCY_NUMERIC.values())) == len(CURRENCY_NUMERIC)
    assert all(re.fullmatch(r"[A-Z]{3}", a) for a in CURRENCY_NUMERIC)
    assert all(re.fullmatch(r"\d{3}", n) for n in CURRENCY_NUMERIC.values())


def test_an_unsupported_currency_says_which() -> None:
    with pytest.raises(UnsupportedCurrency, match="'XYZ'"):
        currency_numeric("XYZ")
    with pytest.raises(UnsupportedCurrency, match="'999'"):
        currency_alpha("999")
