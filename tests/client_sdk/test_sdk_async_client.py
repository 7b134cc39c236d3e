"""AsyncClient runs the same protocol as Client: a few scenarios end to end."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from fake_idempay import CARD, FakeClock, FakeIdempay

from client_sdk import (
    AsyncClient,
    Fenced,
    JournalState,
    NotFoundError,
    PaymentAbortedError,
    PaymentInDoubtError,
    Processing,
)

MakeAsync = Callable[..., AsyncClient]
MANY = 1000


async def test_async_approves_and_resolves_the_journal(
    make_async_client: MakeAsync, fake: FakeIdempay
) -> None:
    async with make_async_client() as client:
        result = await client.purchase(amount=990, currency="BRL", card=CARD)
        entry = client.journal.get(result.id)
    assert result.status == "approved"
    assert fake.seen[0].headers["pos-network"] == "4g"
    assert entry is not None and entry.state is JournalState.RESOLVED


async def test_async_lost_request_is_resent_with_the_same_key(
    make_async_client: MakeAsync, fake: FakeIdempay
) -> None:
    fake.inject("create", "lost_in_network")
    async with make_async_client() as client:
        result = await client.purchase(amount=990, currency="BRL", card=CARD)
    assert [(s.endpoint, s.headers.get("idempotency-attempt")) for s in fake.wire] == [
        ("create", "1"),
        ("lookup", None),
        ("create", "2"),
    ]
    assert {s.headers.get("idempotency-key") for s in fake.calls("create")} == {result.id}


async def test_async_deadline_fences_the_payment(
    make_async_client: MakeAsync, fake: FakeIdempay
) -> None:
    fake.inject("create", *["lost_in_network"] * MANY)
    fake.inject("lookup", *["lost_in_network"] * MANY)
    async with make_async_client() as client:
        with pytest.raises(PaymentAbortedError) as caught:
            await client.purchase(amount=990, currency="BRL", card=CARD, deadline_s=8)
        entry = client.journal.get(caught.value.key)
    assert entry is not None and entry.state is JournalState.ABORTED


async def test_async_in_doubt_then_recover(
    make_async_client: MakeAsync, fake: FakeIdempay, clock: FakeClock
) -> None:
    fake.inject("create", "drop_response")
    fake.inject("lookup", *["lost_in_network"] * MANY)
    fake.inject("abort", *["lost_in_network"] * MANY)
    async with make_async_client() as client:
        with pytest.raises(PaymentInDoubtError) as caught:
            await client.purchase(
                amount=990, currency="BRL", card=CARD, deadline_s=8, reverse_late_approval=True
            )
        fake.faults.clear()
        [recovered] = await client.recover()
    assert recovered.key == caught.value.key
    assert recovered.transaction is not None and recovered.transaction.status == "reversed"
    assert fake.processed[caught.value.key] == 1


async def test_async_single_calls(make_async_client: MakeAsync, fake: FakeIdempay) -> None:
    async with make_async_client() as client:
        paid = await client.purchase(amount=990, currency="BRL", card=CARD)
        assert await client.lookup(paid.id) == paid
        assert await client.abort(paid.id) == paid
        reversed_ = await client.reverse(paid.id)
        assert (reversed_.id, reversed_.status) == (paid.id, "reversed")
        with pytest.raises(NotFoundError):
            await client.lookup("01a1ee56-5e00-7d97-86ac-d904da6cff77")
        fenced = await client.abort("01a1ee56-5e00-7d97-86ac-d904da6cff77")
        assert fenced == Fenced(id="01a1ee56-5e00-7d97-86ac-d904da6cff77", status="aborted")


async def test_async_lookup_reports_processing(
    make_async_client: MakeAsync, fake: FakeIdempay
) -> None:
    fake.pending_polls = 5
    fake.inject("create", "drop_response")
    fake.inject("lookup", *["lost_in_network"] * MANY)
    fake.inject("abort", *["lost_in_network"] * MANY)
    async with make_async_client() as client:
        with pytest.raises(PaymentInDoubtError) as caught:
            await client.purchase(amount=990, currency="BRL", card=CARD, deadline_s=3)
        fake.faults.clear()
        assert await client.lookup(caught.value.key) == Processing(caught.value.key, 1.0)
