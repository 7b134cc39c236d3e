"""The ``Idempay-Signature`` header, Stripe's scheme: ``t=<unix seconds>,v1=<hex>`` where
``v1`` is HMAC-SHA256 keyed by the endpoint's secret over ``b"<t>." + body``. A receiver
recomputes it over the raw body, compares in constant time and refuses a ``t`` older than
its tolerance (a replayed capture); ``verify`` is the reference."""

from __future__ import annotations

import hashlib
import hmac

from api.headers import parse_non_negative_int

HEADER = "Idempay-Signature"
EVENT_ID_HEADER = "Idempay-Event-Id"
TOLERANCE_SECONDS = 300


def _mac(secret: str, timestamp: int, body: bytes) -> str:
    signed = str(timestamp).encode() + b"." + body
    return hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


def signature_header(secret: str, body: bytes, *, timestamp: int) -> str:
    return f"t={timestamp},v1={_mac(secret, timestamp, body)}"


def verify(
    secret: str, header: str, body: bytes, *, now: int, tolerance: int = TOLERANCE_SECONDS
) -> bool:
    """True when ``header`` signs ``body`` with ``secret`` within ``tolerance`` of ``now``;
    False for anything else — a garbled header included (``t`` not ASCII digits, a ``v1``
    that is not ASCII), never an exception: a receiver answers it 401."""
    fields = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
    timestamp = parse_non_negative_int(fields.get("t"))
    if timestamp is None or abs(now - timestamp) > tolerance:
        return False
    try:
        given = fields.get("v1", "").encode("ascii")
    except UnicodeEncodeError:  # compare_digest raises TypeError on non-ASCII str
        return False
    return hmac.compare_digest(given, _mac(secret, timestamp, body).encode())
