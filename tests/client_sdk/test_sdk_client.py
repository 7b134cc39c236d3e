"""The contract §4 protocol end to end against an in-memory fake server (sync Client)."""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from fake_idempay import CARD, FakeClock, FakeIdempay

from client_sdk import (
    Client,
    JournalState,
    PaymentAbortedError,
    UnauthorizedError,
)

MakeClient = Callable[..., Client]
MANY = 1000


def creates(fake: FakeIdempay) -> list[tuple[str, str]]:
    """(key, attempt) of every create the client put on the wire, lost or not."""
    return [
        (s.headers["idempotency-key"], s.headers["idempotency-attempt"])
        for s in fake.wire
        if s.endpoint == "create"
    ]


def endpoints(fake: FakeIdempay) -> list[str]:
    return [s.endpoint for s in fake.seen]


def state_of(client: Client, key: str) -> JournalState:
    entry = client.journal.get(key)
    assert entry is not None
    return entry.state


def test_approves_with_one_create_carrying_the_protocol_headers(
    make_client: MakeClient, fake: FakeIdempay
) -> None:
    result = make_client().purchase(amount=1250, currency="BRL", card=CARD)
    assert (result.status, result.amount, result.currency, result.card.last4) == (
        "approved",
        1250,
        "BRL",
        "4242",
    )
    [call] = fake.seen
    assert call.headers["authorization"] == "Bearer sk_test_fake"
    assert call.headers["idempotency-key"] == result.id
    assert call.headers["idempotency-attempt"] == "1"
    assert call.headers["pos-network"] == "gprs"
    assert call.headers["content-type"] == "application/json"
    assert uuid.UUID(result.id).version == 7
    assert call.body["type"] == "purchase" and call.body["terminal_id"] == "T-0001"


def test_declines_are_definitive_results_not_errors(
    make_client: MakeClient, fake: FakeIdempay
) -> None:
    client = make_client()
    card = {**CARD, "token": "tok_decline_insufficient_funds"}
    result = client.refund(amount=500, currency="BRL", card=card)
    assert (result.status, result.decline_reason, result.type) == (
        "declined",
        "insufficient_funds",
        "refund",
    )
    assert state_of(client, result.id) is JournalState.RESOLVED


def test_the_journal_entry_is_committed_before_the_first_send(
    fake: FakeIdempay, make_client: MakeClient, journal_path: Path
) -> None:
    seen_in_journal: list[tuple[str, str, int, str]] = []

    def spy(request: httpx.Request) -> httpx.Response:
        db = sqlite3.connect(journal_path)  # a separate connection: only committed rows
        key = request.headers["idempotency-key"]
        row = db.execute(
            "SELECT key, state, attempts, request FROM journal_entry WHERE key = ?", (key,)
        ).fetchone()
        db.close()
        seen_in_journal.append(row)
        return fake.handle(request)

    result = make_client(transport=httpx.MockTransport(spy)).purchase(
        amount=1250, currency="BRL", card=CARD
    )
    [(key, state, attempts, request)] = seen_in_journal
    assert (key, state, attempts) == (result.id, "SENT", 1)
    assert json.loads(request) == fake.seen[0].body


def test_a_lost_response_is_resolved_by_lookup_without_resending(
    make_client: MakeClient, fake: FakeIdempay
) -> None:
    fake.inject("create", "drop_response")
    client = make_client()
    result = client.purchase(amount=1250, currency="BRL", card=CARD)
    assert result.status == "approved"
    assert endpoints(fake) == ["create", "lookup"]
    assert fake.processed[result.id] == 1
    entry = client.journal.get(result.id)
    assert entry is not None and (entry.state, entry.attempts) == (JournalState.RESOLVED, 1)


def test_a_lost_request_is_resent_with_the_same_key_after_lookup_404(
    make_client: MakeClient, fake: FakeIdempay
) -> None:
    fake.inject("create", "lost_in_network")
    result = make_client().purchase(amount=1250, currency="BRL", card=CARD)
    assert result.status == "approved"
    assert endpoints(fake) == ["lookup", "create"]  # the first create never arrived
    assert creates(fake) == [(result.id, "1"), (result.id, "2")]
    assert fake.processed[result.id] == 1


def test_a_request_that_never_left_is_resent_without_lookup(
    make_client: MakeClient, fake: FakeIdempay
) -> None:
    fake.inject("create", "drop_request", "drop_request")
    result = make_client().purchase(amount=1250, currency="BRL", card=CARD)
    assert endpoints(fake) == ["create"]  # the two dropped attempts never reached it
    assert creates(fake) == [(result.id, "1"), (result.id, "2"), (result.id, "3")]


def test_409_waits_retry_after_then_looks_up_instead_of_resending(
    make_client: MakeClient, fake: FakeIdempay, clock: FakeClock
) -> None:
    fake.inject("create", "409")
    result = make_client().purchase(amount=1250, currency="BRL", card=CARD)
    assert endpoints(fake) == ["create", "lookup", "create"]
    assert clock.sleeps[0] == 2.0  # the fake's Retry-After
    assert creates(fake) == [(result.id, "1"), (result.id, "2")]


def test_202_processing_is_polled_honouring_retry_after(
    make_client: MakeClient, fake: FakeIdempay, clock: FakeClock
) -> None:
    fake.pending_polls = 3
    result = make_client().purchase(amount=1250, currency="BRL", card=CARD)
    assert result.status == "approved"
    assert endpoints(fake) == ["create", "lookup", "lookup", "lookup"]
    assert clock.sleeps == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("status", ["500", "503"])
def test_5xx_looks_up_first_then_resends_on_404(
    make_client: MakeClient, fake: FakeIdempay, status: str
) -> None:
    fake.inject("create", status)
    result = make_client().purchase(amount=1250, currency="BRL", card=CARD)
    assert endpoints(fake) == ["create", "lookup", "create"]
    assert creates(fake) == [(result.id, "1"), (result.id, "2")]


def test_429_resends_after_retry_after(
    make_client: MakeClient, fake: FakeIdempay, clock: FakeClock
) -> None:
    fake.inject("create", "429", "429")
    result = make_client().purchase(amount=1250, currency="BRL", card=CARD)
    assert endpoints(fake) == ["create", "create", "create"]
    assert [a for _, a in creates(fake)] == ["1", "2", "3"]
    assert clock.sleeps == [2.0, 2.0]
    assert result.status == "approved"


def test_client_errors_are_not_retried_and_end_the_journal_entry(
    make_client: MakeClient, fake: FakeIdempay
) -> None:
    client = make_client(api_key="sk_revoked")
    with pytest.raises(UnauthorizedError) as caught:
        client.purchase(amount=1250, currency="BRL", card=CARD)
    assert (caught.value.code, caught.value.status) == ("unauthorized", 401)
    assert caught.value.request_id is not None and caught.value.request_id.startswith("req_")
    assert endpoints(fake) == ["create"]
    [entry] = client.journal.entries()
    assert entry.state is JournalState.RESOLVED
    assert entry.outcome == {
        "kind": "error",
        "code": "unauthorized",
        "status": 401,
        "detail": "unauthorized",
    }


def test_an_expired_request_is_a_definitive_abort(
    make_client: MakeClient, fake: FakeIdempay
) -> None:
    fake.inject("create", "expire")
    client = make_client()
    with pytest.raises(PaymentAbortedError) as caught:
        client.purchase(amount=1250, currency="BRL", card=CARD)
    assert (caught.value.reason, caught.value.code) == ("expired", "request_expired")
    assert state_of(client, caught.value.key) is JournalState.ABORTED


def test_the_body_is_identical_on_every_attempt_and_carries_expiry(
    make_client: MakeClient, fake: FakeIdempay, clock: FakeClock
) -> None:
    fake.inject("create", "lost_in_network", "500")
    make_client().purchase(
        amount=1250,
        currency="BRL",
        card=CARD,
        deadline_s=30,
        metadata={"order": "A-1"},
        installments=2,
    )
    bodies = [s.body for s in fake.wire if s.endpoint == "create"]
    assert len(bodies) == 3 and bodies[0] == bodies[1] == bodies[2]
    assert bodies[0]["expires_at"] == "2026-11-18T11:07:10.000Z"  # clock start + 30 s
    assert bodies[0]["captured_at"] == "2026-11-18T11:06:40.000Z"


def test_expires_at_can_be_left_out(make_client: MakeClient, fake: FakeIdempay) -> None:
    make_client(send_expires_at=False).purchase(amount=1, currency="BRL", card=CARD)
    assert "expires_at" not in fake.seen[0].body


def test_unknown_networks_are_refused(make_client: MakeClient) -> None:
    with pytest.raises(ValueError, match="network"):
        make_client(network="satellite")
