"""A card number written in non-ASCII decimal digits is still a card number (contract §2.2:
"A field that looks like a card number (PAN: 12–19 digits passing Luhn) anywhere in the body:
422 pan_not_allowed, and the body is not stored or logged").

api/pan.py finds candidates with ``\\d`` (any Unicode decimal digit) but computes
Luhn with ``ord(char) - 48`` (ASCII only): 4242424242424242 in Arabic-Indic digits
(U+0660–U+0669) passes the regex and fails the garbage Luhn — at f1dd311 a real server
answered 201 and stored it (the body in the database); the SDK (``int(char)``) refuses the
same text as a PAN, so the two checks disagree as well."""

from __future__ import annotations

import pytest

from api.pan import contains_pan

PAN = "4242424242424242"


def _spelled(base: int) -> str:
    return "".join(chr(base + int(c)) for c in PAN)


@pytest.mark.parametrize(
    "base",
    [0x0660, 0x06F0, 0x0966, 0xFF10],  # Arabic-Indic, Extended Arabic-Indic, Devanagari, fullwidth
    ids=["arabic-indic", "extended-arabic-indic", "devanagari", "fullwidth"],
)
def test_a_pan_in_non_ascii_digits_is_found(base: int) -> None:
    assert contains_pan({"ref": _spelled(base)})
