"""lookup / abort / reverse as single, idempotent calls (sync Client)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from fake_idempay import CARD, FakeClock, FakeIdempay

from client_sdk import (
    APIConnectionError,
    Client,
    Fenced,
    NotFoundError,
    NotReversibleError,
    RetryPolicy,
    TransactionAbortedError,
)

MakeClient = Callable[..., Client]
UNKNOWN = "01a1ee56-5e00-7d97-86ac-d904da6cff77"


def test_lookup_abort_and_reverse_a_processed_payment(
    make_client: MakeClient, fake: FakeIdempay
) -> None:
    client = make_client()
    paid = client.purchase(amount=1250, currency="BRL", card=CARD)
    assert client.lookup(paid.id) == paid
    assert client.abort(paid.id) == paid  # abort tells the truth, changes nothing
    reversed_ = client.reverse(paid.id)
    assert (reversed_.status, reversed_.id) == ("reversed", paid.id)
    assert client.reverse(paid.id) == reversed_  # idempotent


def test_abort_fences_an_unknown_key_and_lookup_then_says_aborted(
    make_client: MakeClient,
) -> None:
    client = make_client()
    with pytest.raises(NotFoundError):
        client.lookup(UNKNOWN)
    assert client.abort(UNKNOWN) == Fenced(id=UNKNOWN, status="aborted")
    with pytest.raises(TransactionAbortedError) as caught:
        client.lookup(UNKNOWN)
    assert caught.value.status == 410


def test_declines_are_not_reversible(make_client: MakeClient) -> None:
    client = make_client()
    declined = client.purchase(
        amount=1, currency="BRL", card={**CARD, "token": "tok_decline_do_not_honor"}
    )
    with pytest.raises(NotReversibleError) as caught:
        client.reverse(declined.id)
    assert caught.value.code == "not_reversible"


def test_single_calls_retry_network_failures_and_5xx_a_bounded_number_of_times(
    make_client: MakeClient, fake: FakeIdempay, clock: FakeClock
) -> None:
    client = make_client(retry=RetryPolicy(max_retries=2))
    fake.inject("lookup", "lost_in_network", "503")
    with pytest.raises(NotFoundError):
        client.lookup(UNKNOWN)
    assert len([w for w in fake.wire if w.endpoint == "lookup"]) == 3
    assert clock.sleeps[-1] == 2.0  # Retry-After of the 503

    fake.inject("lookup", *["lost_in_network"] * 3)
    with pytest.raises(APIConnectionError) as caught:
        client.lookup(UNKNOWN)
    assert caught.value.sent is True
    assert len([w for w in fake.wire if w.endpoint == "lookup"]) == 6
