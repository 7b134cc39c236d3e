"""``api.jsonfast.compact`` is ``json.dumps(…, separators=(",", ":"))`` byte for byte: the
fingerprint of a key's body, compared on every replay, and the stored bodies depend on it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from api.jsonfast import compact

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(value=JSON, ensure_ascii=st.booleans(), sort_keys=st.booleans())
def test_compact_is_json_dumps_byte_for_byte(
    value: Any, ensure_ascii: bool, sort_keys: bool
) -> None:
    expected = json.dumps(
        value, separators=(",", ":"), ensure_ascii=ensure_ascii, sort_keys=sort_keys
    )
    assert compact(value, ensure_ascii=ensure_ascii, sort_keys=sort_keys) == expected


@pytest.mark.parametrize(
    "value",
    [
        {"b": 1, "a": [1.5, "é€😀", None, True], "c": {"z": "\u2028", "y": 1e300}},
        {"metadata": {"note": "caf\u00e9", "n": -0.0}, "amount": 10**12},
    ],
)
def test_the_bodies_of_a_create(value: Any) -> None:
    for ensure_ascii in (True, False):
        for sort_keys in (True, False):
            assert compact(value, ensure_ascii=ensure_ascii, sort_keys=sort_keys) == json.dumps(
                value, separators=(",", ":"), ensure_ascii=ensure_ascii, sort_keys=sort_keys
            )


def test_what_is_not_json_is_refused_as_json_dumps_refuses_it() -> None:
    with pytest.raises(TypeError, match="not JSON serializable"):
        compact({"when": object()})
