"""The ``Idempay-Signature`` header, Stripe's scheme: ``t=<unix seconds>,v1=<hex>`` where
``v1`` is HMAC-SHA256 keyed by the endpoint's secret over ``b"<t>." + body``. A receiver
recomputes it over the raw body, compares in constant time and refuses a ``t`` older than
its tolerance (a replayed capture); ``verify`` is the reference."""

from __future__ import annotations

import hashlib
import hmac

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
    """True when ``header`` signs ``body`` with ``secret`` within ``tolerance`` of ``now``."""
    fields = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
    try:
        timestamp = int(fields["t"])
    except (KeyError, ValueError):
        return False
    if abs(now - timestamp) > tolerance:
        return False
    return hmac.compare_digest(fields.get("v1", ""), _mac(secret, timestamp, body))
