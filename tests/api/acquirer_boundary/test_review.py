"""A hostile review of the boundary: races and partial failures beyond one fault at a time.

The tests marked ``xfail(strict=True)`` reproduce defects found in this review; each
reason names the mechanism. They turn into plain tests when the product is fixed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from api.acquirer.messages import Request
from tests.api.acquirer.fake_acquirer import Peer, approve
from tests.api.acquirer_boundary.conftest import Rig, metric, wait_log
from tests.api.acquirer_boundary.fake import ThreadedFake
from tests.support.client import assert_problem, body, card, new_key
from tests.support.eventually import eventually

TIMEOUT = "acquirer_timeout"


def test_abort_racing_the_0210_fences_and_the_late_approval_is_undone(rig: Rig) -> None:
    # the 0200 waits up to 10 s; the abort may take the live lease 2 s after the claim
    server = rig.server(IDEMPAY_ACQUIRER_TIMEOUT="10")
    api = rig.api(server)
    rig.acquirer.control(latency_ms=5000)  # approved at once, answered 5 s later
    key = new_key()
    assert api.create(key).status_code == 202
    assert rig.received(key).approved
    aborted = eventually(
        lambda: api.abort(key), what="the abort taking over", until=lambda r: r.status_code != 409
    )
    assert aborted.status_code == 200 and aborted.json()["status"] == "aborted", aborted.text
    # the approval arrives on a fenced key: refused by the lease token, counted as late
    eventually(
        lambda: metric(server, "idempay_acquirer_late_answers_total"),
        what="the late approval counted",
        until=lambda n: n >= 1,
    )
    rig.acquirer.control(latency_ms=0)  # the advice's 0430 within the advice timeout
    assert_problem(api.lookup(key), 410, "transaction_aborted")
    assert_problem(api.create(key), 410, "transaction_aborted")
    assert rig.acknowledged(key)["kind"] == "abort"
    rig.assert_net_zero(key)
    assert rig.txn_rrn(key) is None
    rig.assert_books_match()


def test_reversal_of_an_in_doubt_key_is_not_reversible_and_sends_nothing(rig: Rig) -> None:
    server = rig.server()
    api = rig.api(server)
    key = rig.in_doubt_key(api)
    assert rig.settled(api, key)["decline_reason"] == TIMEOUT
    assert_problem(api.reverse(key), 422, "not_reversible")
    assert rig.acknowledged(key)["kind"] == "timeout"  # its own advice, not a reversal's
    assert "0400" not in [m["mti"] for m in rig.messages(key)]
    rig.assert_net_zero(key)
    rig.assert_books_match()


def test_reversal_raced_by_the_advice_worker_reverses_once(rig: Rig) -> None:
    server = rig.server(IDEMPAY_ADVICE_INTERVAL="0.05")  # the worker finds it at once
    api = rig.api(server)
    keys = [new_key() for _ in range(6)]
    for key in keys:
        assert api.create(key).json()["status"] == "approved"
    rig.acquirer.control(latency_ms=1500)  # the 0400 and a 0420 both in flight
    for key in keys:
        assert api.reverse(key).json()["status"] == "reversed"
    rig.acquirer.control(latency_ms=0)
    for key in keys:
        rig.acknowledged(key)
        seen = rig.at_acquirer(key)
        assert seen is not None and seen.approved and seen.reversed and seen.requests == 1
    rig.assert_books_match()
    assert rig.approved_rrns() == set()


# The link's own observations on /metrics (api/acquirer/runtime.AcquirerRuntime.observe).
def test_late_answer_shows_in_the_late_answers_metric(sqlite_rig: Rig) -> None:
    rig = sqlite_rig
    server = rig.server()
    api = rig.api(server)
    rig.acquirer.control(late_answer=1.0, late_seconds=6.0)
    key = new_key()
    api.create(key)
    rig.received(key)
    rig.acquirer.control(late_answer=0.0)
    assert rig.settled(api, key)["decline_reason"] == TIMEOUT
    wait_log(server, r"acquirer\.late_answer")  # the link saw it late
    eventually(
        lambda: metric(server, "idempay_acquirer_late_answers_total"),
        what="the late 0210 counted",
        until=lambda n: n >= 1,
    )


def test_link_state_metric_shows_the_link_up(sqlite_rig: Rig) -> None:
    rig = sqlite_rig
    server = rig.server()
    api = rig.api(server)
    assert api.create(new_key()).json()["status"] == "approved"  # the link is up
    eventually(
        lambda: metric(server, "idempay_acquirer_link_up"), what="link up", until=lambda v: v == 1
    )


# ----------------------------------------------------------------- reproduced defects


def test_in_doubt_advice_names_the_original_stan(sqlite_rig: Rig) -> None:
    rig = sqlite_rig
    server = rig.server()
    api = rig.api(server)
    key = rig.in_doubt_key(api)
    rig.settled(api, key)
    advice = rig.acknowledged(key)
    (sent,) = [m for m in rig.messages(key) if m["mti"] == "0200"]
    assert advice["original_stan"] == sent["stan"]


# A hostile acquirer that cuts a frame short: the prefix promises 64 bytes, 10 come.
async def truncating(request: Request, peer: Peer) -> None:
    token = request.authorization.card_token if request.authorization else ""
    if token == "tok_forge_truncated":
        peer.send_raw(b"\x00\x40" + b"0210\x00\x00\x00\x00\x00\x00")
    else:
        await approve(request, peer)


@pytest.fixture
def truncating_fake() -> Iterator[ThreadedFake]:
    fake = ThreadedFake(truncating).start()
    try:
        yield fake
    finally:
        fake.stop()


def test_a_truncated_frame_does_not_cost_the_next_sale(
    sqlite_rig: Rig, truncating_fake: ThreadedFake
) -> None:
    rig = sqlite_rig
    # one connection, and no advice worker: the next message on the link is the sale (an
    # advice sent first loses its 0430 the same way, and resets the link for the sale)
    server = rig.server(
        acquirer_url=truncating_fake.url,
        IDEMPAY_ACQUIRER_CONNECTIONS="1",
        IDEMPAY_ADVICE_ENABLED="false",
    )
    api = rig.api(server)
    eventually(truncating_fake.sign_ons, what="signed on", until=lambda n: n >= 1)
    forged = new_key()
    api.create(forged, body(card=card("tok_forge_truncated")))
    assert rig.settled(api, forged)["decline_reason"] == TIMEOUT  # right: never answered
    plain = new_key()
    response = api.create(plain)
    assert response.status_code == 201, response.text
    assert response.json()["status"] == "approved", response.json()


def test_advices_drain_from_an_acquirer_slower_than_five_seconds(sqlite_rig: Rig) -> None:
    rig = sqlite_rig
    server = rig.server(IDEMPAY_ANSWER_WITHIN="10", IDEMPAY_ACQUIRER_TIMEOUT="15")
    api = rig.api(server)
    rig.acquirer.control(latency_ms=6000)
    key = new_key()
    created = api.create(key)
    assert created.status_code == 201 and created.json()["status"] == "approved"
    assert api.reverse(key).json()["status"] == "reversed"
    assert rig.at_acquirer(key).reversed  # type: ignore[union-attr]  # the 0400 was applied
    rig.acknowledged(key, timeout=45)
