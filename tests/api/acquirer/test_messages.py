"""Building and reading each message, field 48, the RRN, and response codes."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone

import pytest

from api.acquirer import messages as m
from api.acquirer.messages import MessageError
from api.acquirer.spec import UnsupportedCurrency
from api.acquirer.types import AuthorizationRequest, ReversalRequest

NOW = datetime(2026, 11, 28, 22, 0, 5, tzinfo=UTC)
KEY = "0190a1b2-0000-7000-8000-000000000001"


def purchase(**changes: object) -> AuthorizationRequest:
    fields: dict[str, object] = {
        "rrn": m.rrn_for(b"secret", "merchant-1", KEY), "merchant_id": "merchant-1",
        "terminal_id": "T-0001", "card_token": "tok_visa", "amount": 1250, "currency": "BRL",
        "type": "purchase", "captured_at": datetime(2026, 11, 28, 21, 59, 58, tzinfo=UTC),
    }  # fmt: skip
    return AuthorizationRequest(**(fields | changes))  # type: ignore[arg-type]


def reversal(**changes: object) -> ReversalRequest:
    fields: dict[str, object] = {
        "rrn": "0A1B2C3D4E5F", "merchant_id": "merchant-1", "terminal_id": "T-0001",
        "amount": 1250, "currency": "USD", "type": "refund", "original_stan": "000041",
        "original_transmitted_at": NOW - timedelta(seconds=30),
    }  # fmt: skip
    return ReversalRequest(**(fields | changes))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "req",
    [purchase(), purchase(type="refund", currency="JPY", captured_at=None),
     purchase(merchant_id="m;=%é", card_token="tok_a=b;c", amount=10**12 - 1)],
    ids=["purchase", "refund without capture time", "awkward ids"],
)  # fmt: skip
def test_0200_round_trips_to_the_request(req: AuthorizationRequest) -> None:
    read = m.parse_request(m.financial_request(req, stan="000042", transmitted_at=NOW), now=NOW)
    assert (read.mti, read.stan, read.transmitted_at) == ("0200", "000042", NOW)
    assert read.authorization == req
    assert read.fields["41"] == m.terminal_field("T-0001")
    assert read.fields["42"] == m.merchant_field(req.merchant_id)


def test_0200_carries_the_terminal_wall_clock_in_fields_12_and_13() -> None:
    local = datetime(2026, 11, 28, 19, 59, 58, tzinfo=timezone(timedelta(hours=-3)))
    read = m.parse_request(m.financial_request(purchase(captured_at=local), stan="000001",
                                               transmitted_at=NOW), now=NOW)  # fmt: skip
    assert (read.fields["12"], read.fields["13"]) == ("195958", "1128")


@pytest.mark.parametrize(
    ("build", "mti"),
    [(m.reversal_request, "0400"), (m.reversal_advice, "0420")],
)
def test_reversals_round_trip_with_the_original_in_field_90(build: object, mti: str) -> None:
    payload = build(reversal(), stan="000043", transmitted_at=NOW)  # type: ignore[operator]
    read = m.parse_request(payload, now=NOW)
    assert (read.mti, read.reversal) == (mti, reversal())
    assert read.fields["90"] == "0200" + "000041" + "1128215935" + "0" * 22


def test_a_repeated_advice_is_0421_and_an_unknown_original_time_is_zeros() -> None:
    req = reversal(repeat=True, original_transmitted_at=None, original_stan="000000")
    read = m.parse_request(m.reversal_advice(req, stan="000044", transmitted_at=NOW), now=NOW)
    assert (read.mti, read.reversal, read.fields["90"][10:20]) == ("0421", req, "0" * 10)


@pytest.mark.parametrize("code", [m.SIGN_ON, m.SIGN_OFF, m.ECHO])
def test_network_requests_and_their_answers(code: str) -> None:
    read = m.parse_request(m.network_request(code, stan="000001", transmitted_at=NOW), now=NOW)
    assert (read.mti, read.network_code) == ("0800", code)
    answer = m.parse_answer(m.answer(read, response_code="00"))
    assert answer == m.Answer("0810", "000001", "", "00", None)


@pytest.mark.parametrize(
    ("request_bytes", "answer_mti"),
    [(m.financial_request(purchase(), stan="000007", transmitted_at=NOW), "0210"),
     (m.reversal_request(reversal(), stan="000007", transmitted_at=NOW), "0410"),
     (m.reversal_advice(reversal(repeat=True), stan="000007", transmitted_at=NOW), "0430")],
)  # fmt: skip
def test_answers_echo_stan_and_rrn(request_bytes: bytes, answer_mti: str) -> None:
    read = m.parse_request(request_bytes, now=NOW)
    answer = m.parse_answer(m.answer(read, response_code="00", authorization_code="A1B2C3"))
    assert (answer.mti, answer.stan, answer.rrn) == (answer_mti, "000007", read.fields["37"])


@pytest.mark.parametrize(
    ("code", "approved", "reason"),
    [("00", True, None), ("51", False, "insufficient_funds"), ("05", False, "do_not_honor"),
     ("91", False, "issuer_unavailable"), ("96", False, "system_malfunction"),
     ("12", False, "invalid_transaction"), ("13", False, "invalid_amount"),
     ("14", False, "invalid_card"), ("54", False, "expired_card"),
     ("N7", False, "response_code_N7")],
)  # fmt: skip
def test_response_codes_name_the_decline(code: str, approved: bool, reason: str | None) -> None:
    auth = m.authorization_from(m.Answer("0210", "000001", "RRN", code, "A1B2C3"))
    assert (auth.approved, auth.decline_reason, auth.response_code) == (approved, reason, code)
    assert auth.authorization_code == ("A1B2C3" if approved else None)


def test_private_data_escapes_what_would_split_it() -> None:
    text = m.private_data("a;b=c%d", "T-1", "tok_é")
    assert text == "M=a%3Bb%3Dc%25d;T=T-1;K=tok_%C3%A9"
    assert m.parse_private_data(text) == ("a;b=c%d", "T-1", "tok_é")


def test_private_data_read_in_any_order_ignoring_unknown_tags() -> None:
    assert m.parse_private_data("K=tok;X=new;T=t;M=m") == ("m", "t", "tok")


@pytest.mark.parametrize("text", ["M=m;T=t", "M=m;M=n;T=t;K=k", "M=m;T=t;K", ""])
def test_private_data_missing_repeated_or_malformed_is_an_error(text: str) -> None:
    with pytest.raises(MessageError):
        m.parse_private_data(text)


def test_private_data_longer_than_999_is_refused() -> None:
    with pytest.raises(MessageError, match="999"):
        m.private_data("m" * 990, "T", "tok")


def test_rrn_is_stable_twelve_base36_and_keyed() -> None:
    rrn = m.rrn_for(b"secret", "merchant-1", KEY)
    assert rrn == "FD4ARJR27RY1"  # the same on every process, restart and release
    assert m.rrn_for(b"secret", "merchant-1", KEY.upper()) == rrn
    assert re.fullmatch(r"[0-9A-Z]{12}", rrn)
    assert m.rrn_for(b"other", "merchant-1", KEY) != rrn
    assert m.rrn_for(b"secret", "merchant-2", KEY) != rrn
    assert m.rrn_for(b"secret", "ab", "c") != m.rrn_for(b"secret", "a", "bc")


def test_rrns_spread_over_many_keys() -> None:
    rrns = {m.rrn_for(b"s", "merchant", f"key-{i}") for i in range(20_000)}
    assert len(rrns) == 20_000


def test_terminal_and_merchant_fields_have_their_widths() -> None:
    assert re.fullmatch(r"[A-Z2-7]{8}", m.terminal_field("T-0001"))
    assert re.fullmatch(r"[A-Z2-7]{15}", m.merchant_field("merchant-1"))
    assert m.terminal_field("T-0001") != m.terminal_field("T-0002")


@pytest.mark.parametrize(
    ("changes", "error"),
    [({"currency": "XYZ"}, UnsupportedCurrency), ({"amount": 10**12}, MessageError),
     ({"rrn": "SHORT"}, MessageError)],
)  # fmt: skip
def test_a_0200_that_cannot_be_built_raises_before_any_bytes(
    changes: dict[str, object], error: type[Exception]
) -> None:
    with pytest.raises(error):
        m.financial_request(purchase(**changes), stan="000001", transmitted_at=NOW)


@pytest.mark.parametrize(
    "payload",
    [b"", b"garbage", b"0210", b"0210" + b"F" * 16,
     m.financial_request(purchase(), stan="000001", transmitted_at=NOW),  # a request
     m.answer(m.Request("0800", "00000X", NOW, {"11": "00000X", "70": "301"}),
              response_code="00")],
    ids=["empty", "text", "mti only", "bitmap of absent fields", "a request", "bad STAN"],
)  # fmt: skip
def test_anything_but_an_answer_is_a_message_error(payload: bytes) -> None:
    with pytest.raises(MessageError):
        m.parse_answer(payload)


def test_an_answer_without_its_rrn_is_a_message_error() -> None:
    read = m.parse_request(m.financial_request(purchase(), stan="000001", transmitted_at=NOW))
    bare = m.answer(m.Request("0200", "000001", NOW, {"11": "000001"}), response_code="00")
    assert read.fields["37"]
    with pytest.raises(MessageError, match="37"):
        m.parse_answer(bare)


def test_transmission_time_is_read_back_in_the_year_nearest_now() -> None:
    new_year = datetime(2027, 1, 1, 0, 0, 1, tzinfo=UTC)
    sent = datetime(2026, 12, 31, 23, 59, 59, tzinfo=UTC)
    payload = m.network_request(m.ECHO, stan="000001", transmitted_at=sent)
    assert m.parse_request(payload, now=new_year).transmitted_at == sent
