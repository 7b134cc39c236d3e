"""What the SDK accepts as the payment's answer once a request may have left (issue 24
items 3 and 5, issue 14 items 1 and 5): only an answer about this key; anything else —
a foreign body, a rejection of a later attempt, an exception that is not a transport
error, a journal failure — leaves the payment in doubt until the key is resolved."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from fake_idempay import CARD, FakeIdempay, _transaction

from client_sdk import (
    Client,
    Journal,
    JournalError,
    JournalState,
    PaymentAbortedError,
    PaymentInDoubtError,
    Transaction,
)

MakeClient = Callable[..., Client]
KINDS = ["purchase", "refund"]


def _pay(client: Client, kind: str, **overrides: Any) -> Transaction:
    options: dict[str, Any] = {"amount": 1250, "currency": "BRL", "card": CARD, "deadline_s": 30}
    options.update(overrides)
    pay = client.purchase if kind == "purchase" else client.refund
    return pay(**options)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "failure",
    [
        lambda r: httpx.DecodingError("mangled gzip body", request=r),
        lambda r: RuntimeError("Event loop is closed"),
    ],
    ids=["decoding-error", "runtime-error"],
)
def test_an_exception_after_the_send_puts_the_payment_in_doubt_and_it_is_resolved(
    make_client: MakeClient,
    fake: FakeIdempay,
    kind: str,
    failure: Callable[[httpx.Request], Exception],
) -> None:
    """Item 3: the server processed the create; what came back was not a transport
    error, and used to escape raw to the app — which would charge again."""
    first = True

    def handle(request: httpx.Request) -> httpx.Response:
        nonlocal first
        response = fake.handle(request)
        if request.method == "POST" and request.url.path == "/v1/transactions" and first:
            first = False
            raise failure(request)
        return response

    result = _pay(make_client(transport=httpx.MockTransport(handle)), kind)
    assert result.status == "approved" and result.type == kind
    assert [s.endpoint for s in fake.seen] == ["create", "lookup"]
    assert fake.processed[result.id] == 1


FOREIGN = _transaction(
    "01a1ee56-5e00-7d97-86ac-d904da6cff77",
    {"card": CARD, "terminal_id": "T-0001", "type": "purchase", "amount": 100, "currency": "BRL"},
)


@pytest.mark.parametrize(
    "change",
    [{}, {"amount": 100}, {"currency": "BRL"}, {"type": "refund"}],
    ids=["another-id", "another-amount", "another-currency", "another-type"],
)
def test_an_answer_about_another_transaction_is_never_this_payments_result(
    make_client: MakeClient, fake: FakeIdempay, change: dict[str, Any]
) -> None:
    """Item 5: a 200 lookup carrying a different transaction (a misbehaving proxy or
    cache) became the result: "approved, 100 BRL" for a 99,999 USD purchase."""
    fake.inject("create", "lost_in_network")

    def handle(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            key = request.url.path.rsplit("/", 1)[-1]
            body = dict(FOREIGN) if not change else {**fake_body(key), **change}
            return httpx.Response(200, json=body)
        return fake.handle(request)

    def fake_body(key: str) -> dict[str, Any]:
        request = {"card": CARD, "terminal_id": "T-0001", "type": "purchase"}
        return _transaction(key, {**request, "amount": 9_999_900, "currency": "USD"})

    client = make_client(transport=httpx.MockTransport(handle))
    with pytest.raises(PaymentAbortedError) as caught:
        client.purchase(amount=9_999_900, currency="USD", card=CARD, deadline_s=5)
    key = caught.value.key
    assert fake.keys[key].state == "aborted"  # the abort fenced it: definitive, not charged
    entry = client.journal.get(key)
    assert entry is not None and entry.state is JournalState.ABORTED


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("status", [401, 413, 400])
def test_a_later_attempts_rejection_waits_for_the_earlier_copy_instead_of_failing(
    make_client: MakeClient, fake: FakeIdempay, kind: str, status: int
) -> None:
    """Issue 14 item 1: the first copy is still travelling when the resend is rejected;
    the SDK reported the rejection and the first copy was then charged."""
    held: list[httpx.Request] = []
    lookups = 0

    def handle(request: httpx.Request) -> httpx.Response:
        nonlocal lookups
        if request.method == "POST" and request.url.path == "/v1/transactions":
            if not held:  # the original: held in the network, the terminal times out
                held.append(request)
                raise httpx.ReadTimeout("held in the network", request=request)
            problem = {"type": "about:blank", "title": "proxy", "status": status, "code": None}
            return httpx.Response(status, json=problem)  # a proxy refuses the resend
        if request.method == "GET":
            lookups += 1
            if lookups == 3:  # the original finally reaches the server
                fake.handle(held[0])
        return fake.handle(request)

    result = _pay(make_client(transport=httpx.MockTransport(handle)), kind)
    assert result.status == "approved"
    assert fake.processed[result.id] == 1
    assert [s.endpoint for s in fake.seen].count("create") == 1  # only the original


def test_a_later_attempts_rejection_ends_aborted_not_rejected_when_nothing_arrives(
    make_client: MakeClient, fake: FakeIdempay
) -> None:
    fake.inject("create", "lost_in_network")

    def handle(request: httpx.Request) -> httpx.Response:
        if request.headers.get("idempotency-attempt") == "2":
            problem = {"status": 413, "code": "payload_too_large"}
            return httpx.Response(413, json=problem)
        return fake.handle(request)

    client = make_client(transport=httpx.MockTransport(handle))
    with pytest.raises(PaymentAbortedError) as caught:
        _pay(client, "purchase", deadline_s=5)
    assert caught.value.code == "payload_too_large"
    assert fake.keys[caught.value.key].state == "aborted"
    assert [s.endpoint for s in fake.seen][-1] == "abort"


def test_a_408_is_retried_like_a_lost_response(make_client: MakeClient, fake: FakeIdempay) -> None:
    def handle(request: httpx.Request) -> httpx.Response:
        if request.headers.get("idempotency-attempt") == "1":
            return httpx.Response(408, json={"status": 408, "code": "request_timeout"})
        return fake.handle(request)

    result = _pay(make_client(transport=httpx.MockTransport(handle)), "purchase")
    assert result.status == "approved"
    assert [s.endpoint for s in fake.seen] == ["lookup", "create"]


class FailingJournal(Journal):
    """A journal whose disk fills up when the payment's final state is written."""

    def __init__(self, path: Path, *, fail_on: JournalState) -> None:
        super().__init__(path)
        self.fail_on = fail_on

    def transition(self, key: str, state: JournalState, **kwargs: Any) -> Any:
        if state is self.fail_on:
            raise sqlite3.OperationalError("database or disk is full")
        return super().transition(key, state, **kwargs)


@pytest.mark.parametrize("kind", KINDS)
def test_a_journal_failure_after_the_201_is_in_doubt_carrying_the_result(
    make_client: MakeClient, fake: FakeIdempay, journal_path: Path, kind: str
) -> None:
    """Issue 14 item 5: purchase() raised sqlite3.OperationalError after a 201; an app
    reading that as "failed" charges again under a new key."""
    journal = FailingJournal(journal_path, fail_on=JournalState.RESOLVED)
    with pytest.raises(PaymentInDoubtError) as caught:
        _pay(make_client(journal=journal), kind)
    result = caught.value.result
    assert isinstance(result, Transaction) and result.id == caught.value.key
    assert result.status == "approved" and fake.processed[result.id] == 1
    entry = journal.get(result.id)
    assert entry is not None and entry.state is JournalState.SENT  # kept for recover()
    journal.fail_on = JournalState.PENDING  # the disk has room again
    [recovered] = make_client(journal=journal).recover()
    assert recovered.transaction is not None and recovered.transaction.id == result.id
    journal.close()


def test_a_journal_failure_before_anything_left_is_a_journal_error(
    make_client: MakeClient, fake: FakeIdempay, journal_path: Path
) -> None:
    journal = FailingJournal(journal_path, fail_on=JournalState.SENT)
    with pytest.raises(JournalError):
        _pay(make_client(journal=journal), "purchase")
    assert fake.wire == []
    journal.close()
