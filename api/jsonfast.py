"""``json.dumps(value, separators=(",", ":"), …)``, byte for byte, for less CPU.

``json.dumps`` with any argument builds a ``JSONEncoder`` and a C encoder per call; the hot
path serializes a few bodies per create (the fingerprint's canonical body, the stored
response, the outbox event), so the C encoder is built once per flavour here and reused.
The output is the same string (``tests/api/test_jsonfast.py``) for acyclic values — all
this module is given; there is no circular-reference check.
"""

from __future__ import annotations

import json
import json.encoder
from typing import Any


def _not_json(value: Any) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


_C_MAKE_ENCODER = getattr(json.encoder, "c_make_encoder", None)  # None without _json


def _encoder(ensure_ascii: bool, sort_keys: bool) -> Any:
    if _C_MAKE_ENCODER is None:
        return None
    strings = (
        json.encoder.encode_basestring_ascii if ensure_ascii else json.encoder.encode_basestring
    )
    # markers None (no cycle check), default, strings, indent None, key and item separators,
    # sort_keys, skipkeys False, allow_nan True — what json.dumps passes for these options.
    return _C_MAKE_ENCODER(None, _not_json, strings, None, ":", ",", sort_keys, False, True)


_ENCODERS = {
    (ascii_only, sort): _encoder(ascii_only, sort)
    for ascii_only in (True, False)
    for sort in (True, False)
}


def compact(value: Any, *, ensure_ascii: bool = True, sort_keys: bool = False) -> str:
    """``json.dumps(value, separators=(",", ":"), ensure_ascii=…, sort_keys=…)``."""
    encode = _ENCODERS[(ensure_ascii, sort_keys)]
    if encode is None:
        return json.dumps(
            value, separators=(",", ":"), ensure_ascii=ensure_ascii, sort_keys=sort_keys
        )
    return "".join(encode(value, 0))
