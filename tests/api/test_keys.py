"""Parsing the Idempotency-Key header (api/idempotency/keys.py) without a server."""

from __future__ import annotations

import pytest

from api.errors import ApiError
from api.idempotency.keys import parse_key

KEY = "6f1c4a52-8d1e-4c1e-9a63-2b4f0c6e9d10"


@pytest.mark.parametrize("raw", [KEY, KEY.upper(), f'"{KEY}"', f" {KEY}\t", f'\t"{KEY.upper()}" '])
def test_accepted_spellings_give_the_canonical_key(raw: str) -> None:
    assert parse_key(raw) == KEY


@pytest.mark.parametrize("raw", [f"\xa0{KEY}", f"{KEY}\x85", f"\u2003{KEY}", f"{KEY}\n"])
def test_only_http_whitespace_is_trimmed(raw: str) -> None:
    with pytest.raises(ApiError) as refused:
        parse_key(raw)
    assert refused.value.code == "idempotency_key_invalid"


@pytest.mark.parametrize("raw", [None, "", "  ", "\t"])
def test_a_blank_header_is_missing(raw: str | None) -> None:
    with pytest.raises(ApiError) as refused:
        parse_key(raw)
    assert refused.value.code == "idempotency_key_missing"
