"""Frozen typed results and the create body (client_sdk/_models.py, _request.py)."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from api.pan import contains_pan as server_contains_pan
from client_sdk import Card, CardSummary, PanNotAllowedError, Transaction
from client_sdk._models import card_from
from client_sdk._request import build_body, contains_pan, iso_utc

BODY: dict[str, Any] = {
    "id": "k1",
    "status": "declined",
    "decline_reason": "insufficient_funds",
    "authorization_code": None,
    "terminal_id": "T-0001",
    "type": "refund",
    "amount": 1250,
    "currency": "BRL",
    "card": {"last4": "4242", "brand": "visa"},
    "installments": 3,
    "created_at": "2026-11-20T12:00:00Z",
    "processed_at": "2026-11-20T12:00:01.5+00:00",
    "reversed_at": None,
}


def test_transaction_exposes_every_body_field_as_typed_attributes() -> None:
    txn = Transaction.from_json(BODY)
    assert (txn.id, txn.status, txn.decline_reason, txn.authorization_code) == (
        "k1",
        "declined",
        "insufficient_funds",
        None,
    )
    assert (txn.terminal_id, txn.type, txn.amount, txn.currency, txn.installments) == (
        "T-0001",
        "refund",
        1250,
        "BRL",
        3,
    )
    assert txn.card == CardSummary(last4="4242", brand="visa")
    assert txn.created_at == datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
    assert txn.processed_at == datetime(2026, 11, 20, 12, 0, 1, 500000, tzinfo=UTC)
    assert txn.reversed_at is None
    assert not txn.approved


def test_results_are_frozen_and_slotted() -> None:
    txn = Transaction.from_json(BODY)
    with pytest.raises(dataclasses.FrozenInstanceError):
        txn.status = "approved"  # type: ignore[misc]
    assert not hasattr(txn, "__dict__")


@pytest.mark.parametrize(
    "broken",
    [
        {"status": "processing"},
        {"amount": "1250"},
        {"amount": True},
        {"card": None},
        {"id": None},
        {"created_at": "yesterday"},
    ],
)
def test_a_body_that_is_not_a_transaction_is_refused(broken: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        Transaction.from_json({**BODY, **broken})


def test_card_accepts_a_mapping_or_a_card_and_requires_every_field() -> None:
    card = Card(token="tok_visa_4242", last4="4242", brand="visa")
    assert card_from(card) is card
    assert card_from({"token": "tok_visa_4242", "last4": "4242", "brand": "visa"}) == card
    with pytest.raises(ValueError, match="brand"):
        card_from({"token": "tok_visa_4242", "last4": "4242"})


def _body(**overrides: Any) -> str:
    options: dict[str, Any] = {
        "terminal_id": "T-0001",
        "kind": "purchase",
        "amount": 1250,
        "currency": "BRL",
        "card": Card("tok_visa_4242", "4242", "visa"),
        "installments": None,
        "metadata": None,
        "captured_at": datetime(2026, 11, 20, 9, 0, tzinfo=timezone(timedelta(hours=-3))),
        "expires_at": None,
    }
    options.update(overrides)
    return build_body(**options)


def test_the_body_is_canonical_json_in_utc_with_only_the_given_optionals() -> None:
    body = json.loads(_body())
    assert body == {
        "terminal_id": "T-0001",
        "type": "purchase",
        "amount": 1250,
        "currency": "BRL",
        "card": {"token": "tok_visa_4242", "last4": "4242", "brand": "visa"},
        "captured_at": "2026-11-20T12:00:00.000Z",
    }
    assert _body() == _body()
    full = json.loads(
        _body(
            installments=3,
            metadata={"order": "A-1"},
            expires_at=datetime(2026, 11, 20, 12, 1, tzinfo=UTC),
        )
    )
    assert (full["installments"], full["metadata"], full["expires_at"]) == (
        3,
        {"order": "A-1"},
        "2026-11-20T12:01:00.000Z",
    )


@pytest.mark.parametrize(
    "overrides",
    [
        {"amount": 0},
        {"amount": 12.5},
        {"amount": True},
        {"currency": "brl"},
        {"currency": "REAL"},
        {"captured_at": datetime(2026, 11, 20)},
    ],  # noqa: DTZ001
)
def test_invalid_bodies_are_refused_before_anything_is_journaled(overrides: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        _body(**overrides)


@pytest.mark.parametrize(
    "overrides",
    [
        {"metadata": {"note": "4111 1111 1111 1111"}},
        {"metadata": {"pan": 4111111111111111}},
        {"metadata": {"nested": ["x", {"deep": "4242-4242-4242-4242"}]}},
        {"card": Card("4111111111111111", "1111", "visa")},
    ],
)
def test_anything_that_looks_like_a_pan_is_refused_locally(overrides: dict[str, Any]) -> None:
    with pytest.raises(PanNotAllowedError) as caught:
        _body(**overrides)
    assert caught.value.code == "pan_not_allowed"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("4111111111111111", True),
        ("4111111111111112", False),
        ("12345", False),
        ("79927398713", False),
        # a card number inside any text is one (the server's rule: 422 pan_not_allowed)
        ("tok_4111111111111111", True),
        ("ref 4111 1111 1111 1111", True),
        (4111111111111111, True),
        (4111111111111111.0, True),
        (True, False),
        ("\u0664" + "\u0661" * 15, True),  # 4111111111111111 in Arabic-Indic digits
        ("\u00b2" * 16, False),  # superscript two: a digit to isdigit(), not a decimal one
    ],
)
def test_pan_detection_is_12_to_19_digits_passing_luhn(value: object, expected: bool) -> None:
    """The SDK refuses before journaling exactly what the server refuses (one rule)."""
    assert contains_pan(value) is expected
    assert server_contains_pan(value) is expected


def test_iso_utc_refuses_naive_datetimes() -> None:
    with pytest.raises(ValueError):
        iso_utc(datetime(2026, 11, 20))  # noqa: DTZ001
