"""Store and forward (contract §4.12) against the in-memory fake: when a payment may be sold
offline, when it may not, and how a stored payment is forwarded — same key, in order, never
aborted — and reported."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from fake_idempay import CARD, FakeClock, FakeIdempay

from client_sdk import (
    AdviceTooOldError,
    Client,
    Journal,
    JournalState,
    OfflineLimitError,
    OfflinePolicy,
    PaymentAbortedError,
    PaymentInDoubtError,
    StoredPaymentError,
    StoredPaymentOverdueError,
    Transaction,
)

MakeClient = Callable[..., Client]
POLICY = OfflinePolicy(floor_limit=5000, max_stored_count=3, max_stored_amount=9000, max_age_s=3600)
DECLINE = {**CARD, "token": "tok_decline_insufficient_funds"}


def offline_client(make_client: MakeClient, **overrides: Any) -> Client:
    return make_client(offline=overrides.pop("offline", POLICY), **overrides)


def creates(fake: FakeIdempay) -> list[dict[str, Any]]:
    return [call.body for call in fake.calls("create")]


def test_offline_is_off_by_default(fake: FakeIdempay, make_client: MakeClient) -> None:
    fake.down = True
    pos = make_client()
    with pytest.raises(PaymentAbortedError) as caught:
        pos.purchase(amount=1250, currency="BRL", card=CARD, deadline_s=10)
    assert caught.value.reason == "not_sent" and not isinstance(caught.value, OfflineLimitError)
    [entry] = pos.journal.entries()
    assert entry.state is JournalState.ABORTED


def test_a_payment_that_cannot_connect_is_stored_before_the_result_returns(
    fake: FakeIdempay, make_client: MakeClient, clock: FakeClock
) -> None:
    fake.down = True
    pos = offline_client(make_client)
    started = clock.now
    result = pos.purchase(amount=1250, currency="BRL", card=CARD, deadline_s=60)
    assert result.offline is True and result.status == "approved"
    assert result.authorization_code is None and (result.amount, result.currency) == (1250, "BRL")
    assert clock.now - started < 5  # two refused connects, not the whole deadline
    [entry] = Journal(pos.journal.path).entries()  # durable: another handle sees it
    assert (entry.key, entry.state) == (result.id, JournalState.STORED)
    advice = entry.request
    assert advice["entry_mode"] == "offline" and "expires_at" not in advice
    sent = fake.wire[0].body
    assert advice["captured_at"] == sent["captured_at"]  # the original capture time
    assert fake.seen == []  # nothing reached the server
    exposure = pos.journal.offline_exposure()
    assert (exposure.count, dict(exposure.amounts)) == (1, {"BRL": 1250})


def test_limits_refuse_offline_and_are_never_exceeded(
    fake: FakeIdempay, make_client: MakeClient
) -> None:
    fake.down = True
    pos = offline_client(make_client)
    with pytest.raises(OfflineLimitError) as over_floor:
        pos.purchase(amount=5001, currency="BRL", card=CARD)
    assert over_floor.value.limit == "floor_limit" and over_floor.value.reason == "not_sent"
    for amount in (4000, 4000):
        assert pos.purchase(amount=amount, currency="BRL", card=CARD).offline
    with pytest.raises(OfflineLimitError) as over_total:
        pos.purchase(amount=1001, currency="BRL", card=CARD)
    assert over_total.value.limit == "max_stored_amount"
    assert pos.purchase(amount=1000, currency="BRL", card=CARD).offline  # exactly the limit
    with pytest.raises(OfflineLimitError) as over_count:
        pos.purchase(amount=1, currency="USD", card=CARD)
    assert over_count.value.limit == "max_stored_count"
    with pytest.raises(OfflineLimitError) as refund:
        pos.refund(amount=10, currency="BRL", card=CARD)
    assert refund.value.limit in ("purchase_only", "max_stored_count")
    exposure = pos.journal.offline_exposure()
    assert exposure.count == 3 and exposure.amounts == {"BRL": 9000}
    refused = [e for e in pos.journal.entries() if e.state is JournalState.ABORTED]
    assert len(refused) == 4
    assert all(e.outcome and e.outcome["kind"] == "offline_refused" for e in refused)
    assert fake.seen == []


def test_a_refund_is_never_sold_offline(fake: FakeIdempay, make_client: MakeClient) -> None:
    fake.down = True
    with pytest.raises(OfflineLimitError) as caught:
        offline_client(make_client).refund(amount=10, currency="BRL", card=CARD)
    assert caught.value.limit == "purchase_only"


@pytest.mark.parametrize("fault", ["drop_response", "lost_in_network"])
def test_a_payment_that_may_have_reached_the_server_is_never_sold_offline(
    fake: FakeIdempay, make_client: MakeClient, fault: str
) -> None:
    """The first attempt may have arrived (its answer was lost), then the link goes down:
    in doubt as without a policy — never a second path for the same money."""
    fake.inject("create", fault)
    real_handle = fake.handle

    def then_down(request: Any) -> Any:
        try:
            return real_handle(request)
        finally:
            fake.down = fake.down or request.method == "POST"  # after the first create

    fake.handle = then_down  # type: ignore[method-assign]
    pos = offline_client(make_client, abort_grace_s=1.0)
    with pytest.raises(PaymentInDoubtError):
        pos.purchase(amount=1250, currency="BRL", card=CARD, deadline_s=10)
    [entry] = pos.journal.entries()
    assert entry.state is JournalState.IN_DOUBT
    assert pos.journal.offline_exposure().count == 0


def test_stored_payments_are_forwarded_in_order_with_the_same_key_on_the_next_call(
    fake: FakeIdempay, make_client: MakeClient
) -> None:
    fake.down = True
    pos = offline_client(make_client)
    stored = [pos.purchase(amount=a, currency="BRL", card=CARD) for a in (100, 200, 300)]
    attempts_offline = [e.attempts for e in pos.journal.entries()]
    fake.down = False
    online = pos.purchase(amount=400, currency="BRL", card=CARD)
    assert online.offline is False and online.status == "approved"
    sent = fake.calls("create")
    assert [c.headers["idempotency-key"] for c in sent] == [s.id for s in stored] + [online.id]
    for call, attempts in zip(sent[:3], attempts_offline, strict=True):
        assert call.body["entry_mode"] == "offline"
        assert int(call.headers["idempotency-attempt"]) == attempts + 1
    assert "entry_mode" not in sent[3].body
    for payment in stored:
        entry = pos.journal.get(payment.id)
        assert entry is not None and entry.state is JournalState.RESOLVED
        assert entry.outcome is not None and entry.outcome["body"]["offline"] is True
    assert fake.processed == {s.id: 1 for s in [*stored, online]}
    assert pos.journal.offline_exposure().count == 0
    assert pos.recover() == []  # nothing left: forwarded exactly once


def test_recover_forwards_stored_payments_and_never_aborts_them(
    fake: FakeIdempay, make_client: MakeClient
) -> None:
    fake.down = True
    first = offline_client(make_client)
    sold = first.purchase(amount=700, currency="BRL", card=CARD)
    first.close()
    fake.down = False
    rebooted = offline_client(make_client)
    [recovered] = rebooted.recover()
    assert recovered.state is JournalState.RESOLVED and recovered.error is None
    assert recovered.transaction is not None and recovered.transaction.offline
    assert recovered.transaction.id == sold.id
    assert fake.calls("abort") == []
    assert fake.processed == {sold.id: 1}


def test_recover_without_a_policy_still_forwards_what_is_stored(
    fake: FakeIdempay, make_client: MakeClient
) -> None:
    fake.down = True
    sold = offline_client(make_client).purchase(amount=700, currency="BRL", card=CARD)
    fake.down = False
    [recovered] = make_client().recover()  # a client configured without offline selling
    assert recovered.state is JournalState.RESOLVED and recovered.transaction is not None
    assert recovered.transaction.id == sold.id and fake.calls("abort") == []


def test_an_abort_or_reversal_of_a_stored_key_is_refused_and_nothing_is_sent(
    fake: FakeIdempay, make_client: MakeClient
) -> None:
    fake.down = True
    pos = offline_client(make_client)
    sold = pos.purchase(amount=700, currency="BRL", card=CARD)
    fake.down = False
    wire = len(fake.wire)
    with pytest.raises(StoredPaymentError) as caught:
        pos.abort(sold.id)
    assert caught.value.key == sold.id
    with pytest.raises(StoredPaymentError):
        pos.reverse(sold.id)
    assert len(fake.wire) == wire and sold.id not in fake.keys  # not fenced
    [forwarded] = pos.forward()
    assert forwarded.state is JournalState.RESOLVED
    assert pos.reverse(sold.id).status == "reversed"  # once forwarded, an ordinary payment


def test_a_declined_advice_is_reported_through_the_callback_and_the_journal(
    fake: FakeIdempay, make_client: MakeClient
) -> None:
    declined: list[Transaction] = []
    fake.down = True
    pos = offline_client(make_client, on_offline_decline=declined.append)
    sold = pos.purchase(amount=700, currency="BRL", card=DECLINE)
    assert sold.status == "approved" and sold.offline  # the terminal's own answer
    fake.down = False
    [forwarded] = pos.forward()
    assert forwarded.transaction is not None and forwarded.transaction.status == "declined"
    assert [(t.id, t.status, t.offline) for t in declined] == [(sold.id, "declined", True)]
    entry = pos.journal.get(sold.id)
    assert entry is not None and entry.state is JournalState.RESOLVED
    assert entry.outcome is not None and entry.outcome["status"] == "declined"


def test_an_advice_too_old_is_reported_and_kept_never_dropped(
    fake: FakeIdempay, make_client: MakeClient
) -> None:
    errors: list[Exception] = []
    fake.down = True
    pos = offline_client(make_client, on_offline_error=errors.append)
    sold = pos.purchase(amount=700, currency="BRL", card=CARD)
    fake.down = False
    fake.inject("create", "advice_too_old")
    [reported] = pos.forward()
    assert reported.state is JournalState.REPORTED
    assert isinstance(reported.error, AdviceTooOldError) and reported.error.code == "advice_too_old"
    assert [type(e) for e in errors] == [AdviceTooOldError]
    entry = pos.journal.get(sold.id)
    assert entry is not None and entry.state is JournalState.REPORTED
    assert entry.outcome is not None and entry.outcome["code"] == "advice_too_old"
    assert pos.forward() == [] and pos.recover() == []  # final, kept in the journal
    assert [e.key for e in pos.journal.entries()] == [sold.id]
    assert fake.calls("abort") == []


def test_a_stored_payment_past_max_age_is_reported_once_and_blocks_offline_sales(
    fake: FakeIdempay, make_client: MakeClient, clock: FakeClock
) -> None:
    errors: list[Exception] = []
    fake.down = True
    policy = OfflinePolicy(
        floor_limit=5000, max_stored_count=5, max_stored_amount=9000, max_age_s=600
    )
    pos = offline_client(make_client, offline=policy, on_offline_error=errors.append)
    sold = pos.purchase(amount=700, currency="BRL", card=CARD)
    [still] = pos.forward()
    assert still.state is JournalState.STORED and not isinstance(
        still.error, StoredPaymentOverdueError
    )
    clock.now += 601
    [overdue] = pos.forward()
    assert isinstance(overdue.error, StoredPaymentOverdueError) and overdue.error.age_s > 600
    pos.forward()
    assert [type(e) for e in errors] == [StoredPaymentOverdueError]  # told once
    with pytest.raises(OfflineLimitError) as caught:
        pos.purchase(amount=10, currency="BRL", card=CARD)
    assert caught.value.limit == "max_age_s"
    entry = pos.journal.get(sold.id)
    assert entry is not None and entry.state is JournalState.STORED  # not dropped
    fake.down = False
    [done] = pos.forward()
    assert done.state is JournalState.RESOLVED


def test_the_pass_stops_at_the_first_payment_it_cannot_forward(
    fake: FakeIdempay, make_client: MakeClient
) -> None:
    fake.down = True
    pos = offline_client(make_client)
    keys = [pos.purchase(amount=100, currency="BRL", card=CARD).id for _ in range(3)]
    fake.down = False
    fake.inject("create", "500")  # then the answers to look it up are lost too
    fake.inject("lookup", "503", "503")
    results = pos.forward()
    assert [r.key for r in results] == keys
    assert all(r.state is JournalState.STORED for r in results)
    assert {c.headers["idempotency-key"] for c in fake.calls("create")} == {keys[0]}
    assert [r.state for r in pos.forward()] == [JournalState.RESOLVED] * 3
    assert fake.processed == dict.fromkeys(keys, 1)


def test_a_lost_answer_to_an_advice_is_looked_up_never_aborted(
    fake: FakeIdempay, make_client: MakeClient
) -> None:
    fake.down = True
    pos = offline_client(make_client)
    sold = pos.purchase(amount=100, currency="BRL", card=CARD)
    fake.down = False
    fake.inject("create", "drop_response")
    [forwarded] = pos.forward()
    assert forwarded.state is JournalState.RESOLVED
    assert [c.endpoint for c in fake.seen] == ["create", "lookup"]
    assert fake.processed == {sold.id: 1}


def test_reconcile_lists_the_terminals_transactions_page_by_page(
    fake: FakeIdempay, make_client: MakeClient
) -> None:
    from datetime import UTC, datetime

    pos = make_client()
    paid = [pos.purchase(amount=100 + i, currency="BRL", card=CARD).id for i in range(5)]
    swapped = make_client(journal=pos.journal.path.replace("pos.db", "new.db"))
    found = swapped.reconcile(since=datetime(2026, 1, 1, tzinfo=UTC))
    assert [t.id for t in found] == paid
    assert len(fake.calls("list")) == 3  # two per page: 2 + 2 + 1


def test_policy_values_are_checked() -> None:
    with pytest.raises(ValueError, match="floor_limit"):
        OfflinePolicy(floor_limit=-1, max_stored_count=1, max_stored_amount=1, max_age_s=1)
    with pytest.raises(ValueError, match="max_age_s"):
        OfflinePolicy(floor_limit=1, max_stored_count=1, max_stored_amount=1, max_age_s=0)
    with pytest.raises(ValueError, match="connect_attempts"):
        OfflinePolicy(
            floor_limit=1, max_stored_count=1, max_stored_amount=1, max_age_s=1, connect_attempts=0
        )
    with pytest.raises(TypeError, match="OfflinePolicy"):
        Client("http://x", "k", terminal_id="T", journal=":memory:", offline={"floor": 1})  # type: ignore[arg-type]
