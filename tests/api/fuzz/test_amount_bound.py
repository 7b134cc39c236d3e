"""The largest amount the body accepts (contract §2.2: 1 to 10^12) against the acquirer's
field 4 (n12: at most 10^12 − 1). A create at the bound is processed: declined
``invalid_amount`` by the gateway itself (it cannot be carried to the acquirer, so nothing is
sent and nothing is to be reversed) — never a 500 that says nothing was stored while its
claim stays behind ``processing``."""

from __future__ import annotations

from tests.support.backend import Backend
from tests.support.client import Api, body, new_key

TOP = 10**12  # sale_rules: "maximum": 10**12


def test_a_create_at_the_largest_amount_is_answered_and_never_500(
    private_sqlite_backend: Backend,
) -> None:
    server = private_sqlite_backend.server()
    api = Api(server.url, private_sqlite_backend.api_key("amount-bound"))
    key = new_key()
    created = api.create(key, body(amount=TOP))
    assert created.status_code in (201, 422), created.text
    if created.status_code == 201:
        assert created.json()["amount"] == TOP
        assert created.json()["status"] == "declined", created.text
        assert created.json()["decline_reason"] == "invalid_amount", created.text
        assert api.create(key, body(amount=TOP)).status_code == 201  # replayed
    else:
        assert created.json()["code"] == "validation_error", created.text
        assert api.lookup(key).status_code == 404  # nothing stored under the key


def test_the_amount_below_the_bound_is_processed(private_sqlite_backend: Backend) -> None:
    server = private_sqlite_backend.server()
    api = Api(server.url, private_sqlite_backend.api_key("amount-below"))
    created = api.create(new_key(), body(amount=TOP - 1))
    assert created.status_code == 201, created.text
    assert (created.json()["amount"], created.json()["status"]) == (TOP - 1, "approved")
