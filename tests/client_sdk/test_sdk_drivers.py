"""One driver per key (issue 24 items 1 and 2): the lease lives in the journal, recover()
re-reads each entry before acting, and a driver that finds its key settled by another
returns that outcome instead of raising."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from fake_idempay import CARD, FakeIdempay

from client_sdk import Client, Journal, JournalState, Transaction

MakeClient = Callable[..., Client]
OLD = "01a1ee56-5e00-7d97-86ac-d904da6cff77"


def test_a_driver_that_finds_its_key_settled_by_another_returns_that_outcome(
    make_client: MakeClient, fake: FakeIdempay, journal_path: Path
) -> None:
    """Item 1: another driver (another Client or process on the journal) resolved the key
    first; this driver's final write raised InvalidTransitionError — "failed" for an approval."""
    other = Journal(journal_path)

    def handle(request: httpx.Request) -> httpx.Response:
        response = fake.handle(request)
        if response.status_code == 201:
            key = request.headers["idempotency-key"]
            outcome = {"kind": "transaction", "status": "approved", "body": response.json()}
            other.transition(key, JournalState.RESOLVED, outcome=outcome)
        return response

    result = make_client(transport=httpx.MockTransport(handle)).purchase(
        amount=1250, currency="BRL", card=CARD
    )
    assert isinstance(result, Transaction) and result.status == "approved"
    other.close()


def test_recover_rereads_each_entry_and_leaves_a_payment_reported_meanwhile_alone(
    fake: FakeIdempay, journal_path: Path
) -> None:
    """Item 2: recover() worked from a snapshot; a purchase approved and reported
    meanwhile was taken from it past its deadline and reversed. Terminal: approved;
    server: reversed."""
    request = {"terminal_id": "T-0001", "type": "purchase", "amount": 1, "currency": "BRL"}
    with Journal(journal_path) as journal:
        journal.begin(
            OLD,
            json.dumps({**request, "card": CARD}),
            deadline=time.time() + 300,
            reverse_late_approval=False,
        )
        journal.transition(OLD, JournalState.SENT, attempts=1)
    snapshot_taken, reported = threading.Event(), threading.Event()

    def handle(request: httpx.Request) -> httpx.Response:
        if request.method == "POST" and request.url.path == "/v1/transactions":
            assert snapshot_taken.wait(10)  # recover() has listed this payment too
        if request.url.path.endswith(OLD) and request.method == "GET":
            snapshot_taken.set()
            assert reported.wait(10)
            time.sleep(1.2)  # the purchase's 1 s deadline has passed
        return fake.handle(request)

    with Client(
        "http://idempay.test",
        "sk_test_fake",
        terminal_id="T-0001",
        journal=journal_path,
        transport=httpx.MockTransport(handle),
    ) as pos:
        results: list[Transaction] = []

        def buy() -> None:
            results.append(
                pos.purchase(
                    amount=900, currency="BRL", card=CARD, deadline_s=1, reverse_late_approval=True
                )
            )
            reported.set()

        buyer = threading.Thread(target=buy)
        buyer.start()
        while not [e for e in pos.journal.unresolved() if e.key != OLD]:
            time.sleep(0.01)
        recovered = pos.recover()
        buyer.join(10)
    [bought] = results
    assert bought.status == "approved"
    assert fake.calls("reversal") == []
    assert fake.keys[bought.id].transaction["status"] == "approved"  # type: ignore[index]
    assert [r.key for r in recovered] == [OLD]
