"""At the deadline: abort (fence), late results, reversal of late approvals, in doubt."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest
from fake_idempay import CARD, FakeClock, FakeIdempay

from client_sdk import (
    Client,
    JournalState,
    PaymentAbortedError,
    PaymentInDoubtError,
    RetryPolicy,
)

MakeClient = Callable[..., Client]
MANY = 1000
START = FakeClock().now


def entry_state(client: Client, key: str) -> tuple[JournalState, object]:
    entry = client.journal.get(key)
    assert entry is not None
    return entry.state, entry.outcome


def test_at_the_deadline_the_key_is_fenced_and_payment_aborted(
    make_client: MakeClient, fake: FakeIdempay, clock: FakeClock
) -> None:
    fake.inject("create", *["lost_in_network"] * MANY)
    fake.inject("lookup", *["lost_in_network"] * MANY)
    client = make_client()
    with pytest.raises(PaymentAbortedError) as caught:
        client.purchase(amount=1250, currency="BRL", card=CARD, deadline_s=20)
    key = caught.value.key
    assert caught.value.reason == "aborted"
    assert entry_state(client, key) == (
        JournalState.ABORTED,
        {"kind": "fenced", "reason": "aborted", "code": None},
    )
    assert fake.keys[key].state == "aborted" and fake.processed[key] == 0
    assert START + 20 <= clock.now <= START + 20 + 5  # deadline, plus the abort grace
    assert [s.endpoint for s in fake.seen] == ["abort"]


def test_no_create_or_lookup_is_sent_after_the_deadline(
    fake: FakeIdempay, make_client: MakeClient, clock: FakeClock
) -> None:
    sent_at: list[tuple[str, float]] = []

    def timed(request: httpx.Request) -> httpx.Response:
        sent_at.append((request.url.path, clock.now))
        return fake.handle(request)

    fake.inject("create", *["500"] * MANY)
    fake.inject("lookup", *["500"] * MANY)
    client = make_client(transport=httpx.MockTransport(timed), retry=RetryPolicy(cap=3.0))
    with pytest.raises(PaymentAbortedError):
        client.purchase(amount=1250, currency="BRL", card=CARD, deadline_s=15)
    before_abort = [t for path, t in sent_at if not path.endswith("/abort")]
    assert len(before_abort) > 5
    assert max(before_abort) < START + 15
    assert all(s <= 3.0 for s in clock.sleeps)


def test_an_abort_that_finds_the_payment_processed_returns_that_result(
    make_client: MakeClient, fake: FakeIdempay
) -> None:
    fake.inject("create", "drop_response")
    fake.inject("lookup", *["lost_in_network"] * MANY)
    client = make_client()
    result = client.purchase(amount=1250, currency="BRL", card=CARD, deadline_s=10)
    assert result.status == "approved"
    state, outcome = entry_state(client, result.id)
    assert state is JournalState.RESOLVED
    assert isinstance(outcome, dict) and outcome["status"] == "approved"
    assert fake.calls("reversal") == []


def test_a_late_approval_is_reversed_when_the_caller_asked(
    make_client: MakeClient, fake: FakeIdempay
) -> None:
    fake.inject("create", "drop_response")
    fake.inject("lookup", *["lost_in_network"] * MANY)
    fake.inject("reversal", "500")
    client = make_client()
    result = client.purchase(
        amount=1250, currency="BRL", card=CARD, deadline_s=10, reverse_late_approval=True
    )
    assert result.status == "reversed" and result.reversed_at is not None
    assert len(fake.calls("reversal")) == 2  # the 500 was retried
    state, outcome = entry_state(client, result.id)
    assert state is JournalState.RESOLVED
    assert isinstance(outcome, dict) and outcome["status"] == "reversed"


def test_a_late_decline_is_not_reversed(make_client: MakeClient, fake: FakeIdempay) -> None:
    fake.inject("create", "drop_response")
    fake.inject("lookup", *["lost_in_network"] * MANY)
    result = make_client().purchase(
        amount=1250,
        currency="BRL",
        card={**CARD, "token": "tok_decline_do_not_honor"},
        deadline_s=10,
        reverse_late_approval=True,
    )
    assert result.status == "declined"
    assert fake.calls("reversal") == []


def test_an_abort_answering_409_is_retried_until_the_server_settles(
    make_client: MakeClient, fake: FakeIdempay
) -> None:
    fake.pending_polls = MANY  # still processing at the deadline: abort answers 409
    client = make_client(abort_grace_s=30.0)

    original_abort = fake._abort

    def settle_on_third(key: str, record: object) -> httpx.Response:
        if len(fake.calls("abort")) >= 3:
            fake.keys[key].state = "processed"
            fake.processed[key] += 1
        return original_abort(key, fake.keys.get(key))

    fake._abort = settle_on_third  # type: ignore[method-assign]
    result = client.purchase(amount=1250, currency="BRL", card=CARD, deadline_s=10)
    assert result.status == "approved"
    assert len(fake.calls("abort")) == 3


def test_when_not_even_the_abort_gets_through_the_payment_is_in_doubt(
    make_client: MakeClient, fake: FakeIdempay, clock: FakeClock
) -> None:
    fake.inject("create", "drop_response")
    fake.inject("lookup", *["lost_in_network"] * MANY)
    fake.inject("abort", *["lost_in_network"] * MANY)
    client = make_client()
    with pytest.raises(PaymentInDoubtError) as caught:
        client.purchase(amount=1250, currency="BRL", card=CARD, deadline_s=10)
    key = caught.value.key
    assert entry_state(client, key)[0] is JournalState.IN_DOUBT
    assert clock.now <= START + 10 + 5
    fake.faults.clear()

    [recovered] = client.recover()
    assert (recovered.key, recovered.state, recovered.error) == (key, JournalState.RESOLVED, None)
    assert recovered.transaction is not None and recovered.transaction.status == "approved"
    assert entry_state(client, key)[0] is JournalState.RESOLVED
    assert fake.processed[key] == 1


def test_a_payment_that_never_left_the_terminal_aborts_without_doubt(
    make_client: MakeClient, fake: FakeIdempay
) -> None:
    fake.down = True  # every request fails to connect: nothing ever left
    client = make_client()
    with pytest.raises(PaymentAbortedError) as caught:
        client.purchase(amount=1250, currency="BRL", card=CARD, deadline_s=5)
    assert caught.value.reason == "not_sent"
    assert entry_state(client, caught.value.key) == (JournalState.ABORTED, {"kind": "not_sent"})


def test_request_timeouts_never_reach_past_the_deadline(
    fake: FakeIdempay, make_client: MakeClient, clock: FakeClock
) -> None:
    timeouts: list[float] = []

    def spy(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/healthz":  # the clock sync, before the payment's budget
            return fake.handle(request)
        timeouts.append(request.extensions["timeout"]["read"])
        clock.now += 2.5  # every exchange takes 2.5 s of the budget
        return fake.handle(request)

    fake.inject("create", *["lost_in_network"] * MANY)
    fake.inject("lookup", *["lost_in_network"] * MANY)
    client = make_client(
        transport=httpx.MockTransport(spy), timeout=4.0, retry=RetryPolicy(cap=0.0)
    )
    with pytest.raises(PaymentAbortedError):
        client.purchase(amount=1250, currency="BRL", card=CARD, deadline_s=6)
    assert timeouts[:3] == [4.0, 3.5, 1.0]  # 6 s budget: 4, then 6-2.5, then 6-5


def test_an_approval_in_time_is_never_reversed(make_client: MakeClient, fake: FakeIdempay) -> None:
    fake.inject("create", "drop_response")  # resolved by lookup, well before the deadline
    client = make_client()
    first = client.purchase(amount=1, currency="BRL", card=CARD, reverse_late_approval=True)
    second = client.purchase(amount=2, currency="BRL", card=CARD, reverse_late_approval=True)
    assert (first.status, second.status) == ("approved", "approved")
    assert fake.calls("reversal") == []
