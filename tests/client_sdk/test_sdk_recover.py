"""recover(): every unfinished journal entry ends definitive (or stays in doubt, honestly)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from fake_idempay import CARD, FakeClock, FakeIdempay, KeyRecord, _transaction

from client_sdk import Client, Journal, JournalState

MakeClient = Callable[..., Client]
KEY = "01a1ee56-5e00-7d97-86ac-d904da6cff77"
REQUEST = {
    "terminal_id": "T-0001",
    "type": "purchase",
    "amount": 1250,
    "currency": "BRL",
    "card": CARD,
    "captured_at": "2026-11-18T11:06:40.000Z",
}


def leave_entry(
    path: Path,
    *,
    deadline: float,
    state: JournalState = JournalState.SENT,
    attempts: int = 2,
    reverse: bool = False,
) -> None:
    """What a process killed mid-payment leaves behind."""
    with Journal(path) as journal:
        journal.begin(KEY, json.dumps(REQUEST), deadline=deadline, reverse_late_approval=reverse)
        if state is not JournalState.PENDING:
            journal.transition(KEY, state, attempts=attempts)


def test_recover_never_sells_it_fences_a_key_the_server_does_not_know(
    make_client: MakeClient, journal_path: Path, clock: FakeClock, fake: FakeIdempay
) -> None:
    """Issue 24 item 4: recover() looked the key up (404) and sent the payment for the
    first time at boot, while the cashier was already running the sale again."""
    leave_entry(journal_path, deadline=clock.now + 30)
    client = make_client()
    [recovered] = client.recover()
    assert recovered.state is JournalState.ABORTED and recovered.transaction is None
    assert [s.endpoint for s in fake.seen] == ["lookup", "abort"]
    assert fake.calls("create") == [] and fake.keys[KEY].state == "aborted"
    entry = client.journal.get(KEY)
    assert entry is not None and (entry.state, entry.attempts) == (JournalState.ABORTED, 2)


def test_recover_fences_a_never_sent_entry_without_looking_it_up(
    make_client: MakeClient, journal_path: Path, clock: FakeClock, fake: FakeIdempay
) -> None:
    leave_entry(journal_path, deadline=clock.now + 30, state=JournalState.PENDING)
    [recovered] = make_client().recover()
    assert recovered.state is JournalState.ABORTED
    assert [s.endpoint for s in fake.wire] == ["abort"]
    assert fake.keys[KEY].state == "aborted"


def test_recover_fences_an_unprocessed_entry_past_its_deadline_instead_of_resending(
    make_client: MakeClient, journal_path: Path, clock: FakeClock, fake: FakeIdempay
) -> None:
    leave_entry(journal_path, deadline=clock.now - 1)
    [recovered] = make_client().recover()
    assert recovered.state is JournalState.ABORTED
    assert [s.endpoint for s in fake.seen] == ["lookup", "abort"]
    assert fake.keys[KEY].state == "aborted"


def test_recover_settles_a_processed_entry_and_reverses_it_when_late_and_asked(
    make_client: MakeClient, journal_path: Path, clock: FakeClock, fake: FakeIdempay
) -> None:
    fake.keys[KEY] = KeyRecord("processed", "", _transaction(KEY, REQUEST))
    leave_entry(journal_path, deadline=clock.now - 1, state=JournalState.IN_DOUBT, reverse=True)
    [recovered] = make_client().recover()
    assert recovered.transaction is not None and recovered.transaction.status == "reversed"
    assert [s.endpoint for s in fake.seen] == ["lookup", "reversal"]


def test_recover_reports_fenced_keys_as_aborted(
    make_client: MakeClient, journal_path: Path, clock: FakeClock, fake: FakeIdempay
) -> None:
    fake.keys[KEY] = KeyRecord("expired", "")
    leave_entry(journal_path, deadline=clock.now + 30)
    [recovered] = make_client().recover()
    assert recovered.state is JournalState.ABORTED
    assert getattr(recovered.error, "reason", None) == "expired"


def test_recover_waits_for_a_key_still_processing(
    make_client: MakeClient, journal_path: Path, clock: FakeClock, fake: FakeIdempay
) -> None:
    fake.keys[KEY] = KeyRecord("processing", "", _transaction(KEY, REQUEST), polls_left=3)
    leave_entry(journal_path, deadline=clock.now + 30)
    [recovered] = make_client().recover()
    assert recovered.state is JournalState.RESOLVED
    assert [s.endpoint for s in fake.seen] == ["lookup"] * 3
    assert clock.sleeps == [1.0, 1.0]


def test_recover_keeps_an_unreachable_entry_in_doubt_and_touches_no_settled_entry(
    make_client: MakeClient, journal_path: Path, clock: FakeClock, fake: FakeIdempay
) -> None:
    leave_entry(journal_path, deadline=clock.now - 1)
    with Journal(journal_path) as journal:
        journal.begin("settled", "{}", deadline=0.0, reverse_late_approval=False)
        journal.transition("settled", JournalState.RESOLVED)
    fake.blackhole = True
    client = make_client()
    [recovered] = client.recover()
    assert (recovered.key, recovered.state) == (KEY, JournalState.IN_DOUBT)
    assert [e.key for e in client.journal.unresolved()] == [KEY]
    fake.blackhole = False
    assert [r.state for r in client.recover()] == [JournalState.ABORTED]
    assert client.recover() == []


def test_a_pending_entry_that_cannot_reach_the_server_was_never_sent(
    make_client: MakeClient, journal_path: Path, clock: FakeClock, fake: FakeIdempay
) -> None:
    leave_entry(journal_path, deadline=clock.now - 1, state=JournalState.PENDING)
    fake.down = True
    [recovered] = make_client().recover()
    assert recovered.state is JournalState.ABORTED
    assert getattr(recovered.error, "reason", None) == "not_sent"


CHILD = textwrap.dedent("""
    import os, sys, httpx
    from client_sdk import Client

    def die(request):
        if request.url.path == "/healthz":  # the clock sync before the payment
            return httpx.Response(200)
        os._exit(9)  # killed while the first create is on the wire

    client = Client("http://idempay.test", "sk_test_fake", terminal_id="T-0001",
                    journal=sys.argv[1], transport=httpx.MockTransport(die))
    client.purchase(amount=1250, currency="BRL",
                    card={"token": "tok_visa_4242", "last4": "4242", "brand": "visa"})
""")


def test_an_entry_survives_the_process_being_killed_and_recover_settles_it(
    make_client: MakeClient, journal_path: Path, fake: FakeIdempay
) -> None:
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(journal_path)], timeout=60, capture_output=True
    )
    assert child.returncode == 9, child.stderr
    with Journal(journal_path) as journal:
        [left] = journal.unresolved()
    assert (left.state, left.attempts) == (JournalState.SENT, 1)
    client = make_client(clock=time.time, monotonic=time.monotonic, sleep=time.sleep)
    [recovered] = client.recover()
    assert (recovered.key, recovered.state) == (left.key, JournalState.ABORTED)
    assert [s.endpoint for s in fake.seen] == ["lookup", "abort"]  # never resent at boot
    assert fake.keys[left.key].state == "aborted" and not fake.processed


def test_recover_looks_up_with_the_full_timeout_even_past_the_deadline(
    fake: FakeIdempay, make_client: MakeClient, journal_path: Path, clock: FakeClock
) -> None:
    timeouts: list[tuple[str, float]] = []

    def spy(request: httpx.Request) -> httpx.Response:
        timeouts.append((request.method, request.extensions["timeout"]["read"]))
        return fake.handle(request)

    leave_entry(journal_path, deadline=clock.now - 100)
    make_client(transport=httpx.MockTransport(spy), timeout=7.0).recover()
    assert timeouts == [("GET", 7.0), ("POST", 5.0)]  # lookup; abort within its 5 s grace
