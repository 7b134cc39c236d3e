"""The ``Idempay-Signature`` header is Stripe's scheme, computed here by hand."""

from __future__ import annotations

import hashlib
import hmac

from api.webhooks.signing import signature_header, verify

BODY = b'{"event_id":"e1","seq":1}'


def test_the_header_is_hmac_sha256_of_timestamp_dot_body() -> None:
    expected = hmac.new(b"whsec_x", b"1700000000." + BODY, hashlib.sha256).hexdigest()
    assert signature_header("whsec_x", BODY, timestamp=1_700_000_000) == (
        f"t=1700000000,v1={expected}"
    )


def test_verify_refuses_another_body_secret_or_a_stale_timestamp() -> None:
    header = signature_header("whsec_x", BODY, timestamp=1_700_000_000)
    assert verify("whsec_x", header, BODY, now=1_700_000_100)
    assert not verify("whsec_x", header, BODY + b" ", now=1_700_000_100)
    assert not verify("whsec_y", header, BODY, now=1_700_000_100)
    assert not verify("whsec_x", header, BODY, now=1_700_000_000 + 301)
    assert not verify("whsec_x", "v1=abc", BODY, now=1_700_000_000)
