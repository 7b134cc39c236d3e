"""The host decides by the test tokens (SPEC §2), answers duplicates by RRN with the
original 0210, and applies reversals and advices once by RRN."""

from __future__ import annotations

import re
import time

from api.acquirer.host.process import AcquirerProcess
from api.acquirer.host.store import messages, net_approvals, summary
from tests.api.acquirer_host.conftest import Wire, auth_request, reversal_of


def test_tok_approves_with_a_six_character_authorization_code(
    host: AcquirerProcess, wire: Wire
) -> None:
    req = auth_request("tok_visa_4242")
    got = wire.call(req)
    assert got.response_code == "00"
    assert got.authorization_code is not None
    assert re.fullmatch(r"[A-Z0-9]{6}", got.authorization_code)
    row = summary(host.store)[req.rrn]
    assert (row.requests, row.approved, row.reversed) == (1, True, False)
    assert (row.amount, row.currency, row.processing_code) == (1250, "BRL", "000000")
    assert (row.merchant_id, row.terminal_id) == ("merchant-a", "T-0001")
    assert row.authorization_code == got.authorization_code
    assert net_approvals(host.store) == {req.rrn}


def test_declines_answer_their_response_codes(host: AcquirerProcess, wire: Wire) -> None:
    funds = auth_request("tok_decline_insufficient_funds")
    honor = auth_request("tok_decline_do_not_honor")
    assert wire.call(funds).response_code == "51"
    assert wire.call(honor).response_code == "05"
    assert wire.call(funds).authorization_code is None
    rows = summary(host.store)
    assert not rows[funds.rrn].approved and not rows[honor.rrn].approved
    assert net_approvals(host.store) == set()


def test_tok_issuer_slow_is_answered_after_requests_sent_later(
    host: AcquirerProcess, wire: Wire
) -> None:
    slow, fast = auth_request("tok_issuer_slow"), auth_request("tok_visa")
    started = time.monotonic()
    slow_stan = wire.authorize(slow)
    fast_stan = wire.authorize(fast)
    first, second = wire.answer(), wire.answer()
    assert (first.stan, first.rrn, first.response_code) == (fast_stan, fast.rrn, "00")
    assert (second.stan, second.rrn, second.response_code) == (slow_stan, slow.rrn, "00")
    assert time.monotonic() - started >= 1.0  # the fixture's --slow-seconds


def test_tok_issuer_timeout_answers_only_a_later_0200_of_the_rrn(
    host: AcquirerProcess, wire: Wire
) -> None:
    req = auth_request("tok_issuer_timeout")
    wire.authorize(req)
    assert wire.answers_until_echo() == []
    row = summary(host.store)[req.rrn]
    assert (row.requests, row.approved) == (1, True)  # approved, the answer withheld
    assert [m["fate"] for m in messages(host.store, rrn=req.rrn)] == ["withheld"]
    again = wire.call(req)
    assert (again.response_code, again.authorization_code) == ("00", row.authorization_code)
    assert summary(host.store)[req.rrn].requests == 2


def test_tok_issuer_down_never_answers_and_approves_nothing(
    host: AcquirerProcess, wire: Wire
) -> None:
    req = auth_request("tok_issuer_down")
    wire.authorize(req)
    wire.authorize(req)
    assert wire.answers_until_echo() == []
    row = summary(host.store)[req.rrn]
    assert (row.requests, row.approved, row.state) == (2, False, "received")


def test_a_token_that_is_not_a_test_token_is_declined_invalid_card(wire: Wire) -> None:
    assert wire.call(auth_request("card_1234")).response_code == "14"


def test_a_repeated_0200_gets_the_original_0210_and_is_counted(
    host: AcquirerProcess, wire: Wire
) -> None:
    req = auth_request()
    first, second = wire.call(req), Wire(host.port).call(req)
    assert second.stan != first.stan  # each answer echoes its own request's STAN
    assert (second.response_code, second.authorization_code) == (
        first.response_code,
        first.authorization_code,
    )
    assert summary(host.store)[req.rrn].requests == 2
    assert [m["duplicate"] for m in messages(host.store, rrn=req.rrn)] == [0, 1]


def test_reversal_and_advices_reverse_an_approval_once(host: AcquirerProcess, wire: Wire) -> None:
    req = auth_request()
    wire.call(req)
    stan = wire.reverse(reversal_of(req))
    got = wire.answer()
    assert (got.mti, got.stan, got.rrn, got.response_code) == ("0410", stan, req.rrn, "00")
    reversed_at = summary(host.store)[req.rrn].reversed_at
    assert reversed_at is not None
    for repeat in (False, True, True):
        wire.reverse(reversal_of(req, repeat=repeat), advice=True)
        got = wire.answer()
        assert (got.mti, got.response_code) == ("0430", "00")
    row = summary(host.store)[req.rrn]
    assert (row.approved, row.reversed, row.reversed_at) == (True, True, reversed_at)
    assert net_approvals(host.store) == set()


def test_reversing_a_decline_is_acknowledged_and_changes_no_approval(
    host: AcquirerProcess, wire: Wire
) -> None:
    req = auth_request("tok_decline_do_not_honor")
    wire.call(req)
    wire.reverse(reversal_of(req), advice=True)
    assert wire.answer().response_code == "00"
    assert not summary(host.store)[req.rrn].approved


def test_an_advice_before_its_original_is_acknowledged_and_the_0200_then_declined(
    host: AcquirerProcess, wire: Wire
) -> None:
    req = auth_request()
    wire.reverse(reversal_of(req), advice=True)
    got = wire.answer()
    assert (got.mti, got.rrn, got.response_code) == ("0430", req.rrn, "00")
    row = summary(host.store)[req.rrn]
    assert (row.requests, row.approved, row.reversed) == (0, False, True)
    late = wire.call(req)
    assert (late.response_code, late.authorization_code) == ("12", None)
    row = summary(host.store)[req.rrn]
    assert (row.requests, row.approved, row.reversed) == (1, False, True)
    assert net_approvals(host.store) == set()


def test_a_reversal_request_before_its_original_declines_the_0200_too(
    host: AcquirerProcess, wire: Wire
) -> None:
    req = auth_request("tok_issuer_timeout")  # would otherwise approve silently
    wire.reverse(reversal_of(req))
    assert wire.answer().mti == "0410"
    wire.authorize(req)
    got = wire.answer()
    assert (got.mti, got.response_code) == ("0210", "12")
    assert net_approvals(host.store) == set()


def test_sign_on_sign_off_and_echo_are_answered(host: AcquirerProcess, wire: Wire) -> None:
    from api.acquirer.messages import SIGN_OFF, SIGN_ON, network_request
    from tests.api.acquirer_host.conftest import new_stan, now

    for code in (SIGN_ON, "301", SIGN_OFF):
        stan = new_stan()
        wire.send(network_request(code, stan=stan, transmitted_at=now()))
        got = wire.answer()
        assert (got.mti, got.stan, got.response_code) == ("0810", stan, "00")
    assert [m["mti"] for m in messages(host.store)] == ["0800"] * 4  # + the fixture's sign-on


def test_terminates_cleanly_on_sigterm(host: AcquirerProcess) -> None:
    assert host.stop() == 0
