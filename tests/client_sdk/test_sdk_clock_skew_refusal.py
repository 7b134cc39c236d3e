"""A 422 clock_skew is not a rejection to trust: the key's time was ahead of the server's
clock, and a copy of the same attempt (a proxy's retry, a duplicated request) would be
accepted once the server's clock catches up. The SDK fences the key before it reports
(the protocol model's counterexample X2)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from fake_idempay import CARD, FakeIdempay

from client_sdk import Client, JournalState, PaymentAbortedError


def test_a_clock_skew_refusal_fences_the_key_before_reporting(
    make_client: Callable[..., Client], fake: FakeIdempay
) -> None:
    fake.inject("create", "clock_skew")
    client = make_client()
    with pytest.raises(PaymentAbortedError) as caught:
        client.purchase(amount=1250, currency="BRL", card=CARD, deadline_s=30)
    assert caught.value.code == "clock_skew"
    assert [s.endpoint for s in fake.seen] == ["create", "abort"]
    assert fake.keys[caught.value.key].state == "aborted"  # a late copy now gets 410
    entry = client.journal.get(caught.value.key)
    assert entry is not None and entry.state is JournalState.ABORTED
