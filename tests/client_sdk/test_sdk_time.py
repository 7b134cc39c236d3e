"""Time under hostile conditions (issue 24 items 6-8): Retry-After can only lengthen the
backoff, deadlines run on the monotonic clock (an NTP step moves neither way), and the
arguments that bound a payment are validated — the abort is always sent at least once."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from datetime import UTC, datetime
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from fake_idempay import API_KEY, CARD, FakeClock, FakeIdempay

from client_sdk import (
    Client,
    JournalState,
    PaymentAbortedError,
    PaymentInDoubtError,
    RetryPolicy,
)

MakeClient = Callable[..., Client]
STORM = 500  # far more requests than a payment of a few seconds can justify


class Storm(Exception):
    """Raised by the test transport when a payment retries without waiting."""


def _unavailable(retry_after: str, seen: list[str]) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request.method)
        if len(seen) > STORM:
            raise Storm(f"{len(seen)} requests")
        problem = {"status": 503, "code": "service_unavailable"}
        return httpx.Response(503, json=problem, headers={"Retry-After": retry_after})

    return httpx.MockTransport(handle)


@pytest.mark.parametrize(
    "retry_after",
    ["0", format_datetime(datetime(2001, 1, 1, tzinfo=UTC), usegmt=True)],
    ids=["zero", "date-in-the-past"],
)
def test_retry_after_zero_or_in_the_past_never_turns_retries_into_a_storm(
    make_client: MakeClient, clock: FakeClock, retry_after: str
) -> None:
    """Item 6: a proxy's ``Retry-After: 0`` (or a past date) made every wait zero:
    6,969 requests in 2 s from one terminal."""
    seen: list[str] = []
    client = make_client(transport=_unavailable(retry_after, seen), abort_grace_s=2.0)
    with pytest.raises(PaymentInDoubtError):
        client.purchase(amount=100, currency="BRL", card=CARD, deadline_s=2)
    assert clock.sleeps and min(clock.sleeps) > 0
    assert len(seen) < STORM and seen[-1] == "POST"  # ended with its aborts


def _wall(step: float, after: int, calls: list[int]) -> Callable[[], float]:
    """The device's wall clock: NTP steps it by ``step`` seconds after ``after`` reads."""

    def now() -> float:
        calls[0] += 1
        return time.time() + (step if calls[0] > after else 0.0)

    return now


def test_a_wall_clock_stepped_back_does_not_keep_a_payment_retrying(
    fake: FakeIdempay, journal_path: Path
) -> None:
    """Item 7: an NTP step back of an hour kept a 1 s payment retrying (for the hour)."""
    calls = [0]
    sent: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        sent.append(request.method)
        if len(sent) > STORM:
            raise Storm(f"{len(sent)} requests")
        raise httpx.ReadTimeout("lost in the network", request=request)

    with (
        Client(
            "http://idempay.test",
            API_KEY,
            terminal_id="T-0001",
            journal=journal_path,
            transport=httpx.MockTransport(handle),
            clock=_wall(-3600.0, 2, calls),
            retry=RetryPolicy(base=0.01, cap=0.05),
            abort_grace_s=0.2,
        ) as pos,
        pytest.raises(PaymentInDoubtError),
    ):
        pos.purchase(amount=100, currency="BRL", card=CARD, deadline_s=0.5)
    assert len(sent) < STORM


def test_a_wall_clock_stepped_forward_does_not_make_a_quick_approval_late(
    fake: FakeIdempay, journal_path: Path
) -> None:
    """Item 7: a step forward turned a 0.1 s approval "late" and reversed it."""
    calls = [0]
    with Client(
        "http://idempay.test",
        API_KEY,
        terminal_id="T-0001",
        journal=journal_path,
        transport=fake.transport(),
        clock=_wall(3600.0, 2, calls),
    ) as pos:
        result = pos.purchase(
            amount=100, currency="BRL", card=CARD, deadline_s=30, reverse_late_approval=True
        )
    assert result.status == "approved"
    assert fake.calls("reversal") == []


@pytest.mark.parametrize("deadline_s", [math.inf, 1e9, math.nan, 0.0, -1.0, True])
def test_an_insane_deadline_is_refused_before_anything_is_journaled_or_sent(
    make_client: MakeClient, fake: FakeIdempay, deadline_s: Any
) -> None:
    """Item 8: ``inf``/``1e9`` never fenced; ``nan`` gave a misleading journal error."""
    client = make_client()
    with pytest.raises(ValueError, match="deadline_s"):
        client.purchase(amount=100, currency="BRL", card=CARD, deadline_s=deadline_s)
    assert client.journal.entries() == [] and fake.wire == []


@pytest.mark.parametrize(
    "option", [{"abort_grace_s": math.inf}, {"abort_grace_s": math.nan}, {"timeout": math.inf}]
)
def test_insane_client_options_are_refused(
    make_client: MakeClient, option: dict[str, float]
) -> None:
    with pytest.raises(ValueError):
        make_client(**option)


def test_a_zero_abort_grace_still_sends_one_abort(
    make_client: MakeClient, fake: FakeIdempay
) -> None:
    """Item 8: ``abort_grace_s=0`` never sent the abort, leaving the payment in doubt
    for good (recover() could not settle a key nobody fenced)."""
    fake.inject("create", "lost_in_network")
    fake.inject("lookup", *["lost_in_network"] * 200)
    client = make_client(abort_grace_s=0.0)
    with pytest.raises(PaymentAbortedError) as caught:
        client.purchase(amount=100, currency="BRL", card=CARD, deadline_s=2)
    assert len(fake.calls("abort")) == 1
    assert fake.keys[caught.value.key].state == "aborted"
    entry = client.journal.get(caught.value.key)
    assert entry is not None and entry.state is JournalState.ABORTED
