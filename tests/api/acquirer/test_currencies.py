"""The currencies a create may name are exactly those the acquirer link can carry."""

from __future__ import annotations

from api.acquirer.spec import CURRENCY_NUMERIC
from api.sale_rules import CURRENCIES
from api.transactions.schemas import TransactionCreate
from client_sdk._sale_rules import CURRENCIES as SDK_CURRENCIES


def test_the_sale_rules_name_every_currency_of_field_49_and_no_other() -> None:
    assert set(CURRENCIES) == set(CURRENCY_NUMERIC) == set(SDK_CURRENCIES)


def test_a_currency_without_an_iso_4217_numeric_code_is_refused_by_the_schema() -> None:
    body = {
        "terminal_id": "T-1",
        "amount": 100,
        "currency": "XTS",
        "card": {"token": "tok_visa", "last4": "4242", "brand": "visa"},
    }
    try:
        TransactionCreate.model_validate(body)
    except ValueError as exc:
        assert "currency" in str(exc)
    else:
        raise AssertionError("XTS was accepted")
    assert TransactionCreate.model_validate({**body, "currency": "BRL"}).currency == "BRL"
