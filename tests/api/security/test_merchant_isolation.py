"""contract §2 tenancy on every endpoint: merchant B holding merchant A's UUID sees exactly what it
would see for a UUID nobody ever used, and nothing B does changes A's transaction.

Runs on both storage backends (the ``deployment`` fixture)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from api.auth import hash_key
from tests.api.conftest import Deployment
from tests.api.security.conftest import KeptApi, kept, stable_headers
from tests.support.client import assert_problem, body, card, new_key
from tests.support.eventually import eventually

Tenants = tuple[KeptApi, KeptApi]


@pytest.fixture
def tenants(deployment: Deployment) -> Iterator[Tenants]:
    a, b = kept(deployment.a), kept(deployment.b)
    try:
        yield a, b
    finally:
        a.close()
        b.close()


def _ledger(deployment: Deployment, api_key: str, key: str) -> list[tuple[object, ...]]:
    rows = deployment.backend.sql(
        "SELECT l.kind, l.amount, l.currency FROM ledger_entry l JOIN api_key k"
        " ON k.merchant_id = l.merchant_id WHERE k.key_hash = :h AND l.transaction_id = :t"
        " ORDER BY l.kind",
        h=hash_key(api_key),
        t=key,
    )
    return [tuple(row) for row in rows]


def _same_as_unknown(theirs: httpx.Response, unknown: httpx.Response) -> None:
    """Status, code, Idempotency-Status, every other header and the whole body: identical."""
    assert_problem(theirs, 404, "not_found")
    assert_problem(unknown, 404, "not_found")
    assert theirs.json() == unknown.json()
    assert stable_headers(theirs) == stable_headers(unknown)
    assert theirs.headers.get("idempotency-status") == unknown.headers.get("idempotency-status")


def _compare_lookup_and_reversal(b: KeptApi, key: str) -> None:
    for spelling in (key, key.upper()):  # the id is case-insensitive: no spelling leaks
        unknown = new_key()
        theirs = b.lookup(spelling)
        _same_as_unknown(theirs, b.lookup(unknown))
        assert theirs.headers["idempotency-status"] == "not_found"
        _same_as_unknown(b.reverse(spelling), b.reverse(unknown))


def _a_key_in(a: KeptApi, state: str) -> str:
    key = new_key()
    if state == "approved":
        response = a.create(key)
    elif state == "declined":
        response = a.create(key, body(card=card("tok_decline_do_not_honor")))
    elif state == "reversed":
        assert a.create(key).status_code == 201
        response = a.reverse(key)
    else:
        assert state == "aborted"
        response = a.abort(key)
    assert response.status_code in (200, 201), response.text
    return key


@contextmanager
def _a_key_untouched(deployment: Deployment, a: KeptApi, state: str) -> Iterator[str]:
    """A key of merchant A in ``state``; after the block (B's requests on it), A's lookup
    answers the same and A's ledger holds the same rows."""
    key = _a_key_in(a, state)
    a_view, ledger = a.lookup(key), _ledger(deployment, a.api_key, key)
    yield key
    after = a.lookup(key)
    assert (after.status_code, after.text) == (a_view.status_code, a_view.text)
    assert _ledger(deployment, a.api_key, key) == ledger


STATES = ["approved", "declined", "reversed", "aborted"]


@pytest.mark.parametrize("state", STATES)
def test_other_merchant_lookup_and_reversal_answer_exactly_as_for_an_unknown_key(
    deployment: Deployment, tenants: Tenants, state: str
) -> None:
    a, b = tenants
    with _a_key_untouched(deployment, a, state) as key:
        _compare_lookup_and_reversal(b, key)


@pytest.mark.parametrize("state", STATES)
def test_other_merchant_abort_fences_only_its_own_key(
    deployment: Deployment, tenants: Tenants, state: str
) -> None:
    a, b = tenants
    with _a_key_untouched(deployment, a, state) as key:  # A's side: the same answer, ledger
        unknown = new_key()
        fenced, fenced_unknown = b.abort(key), b.abort(unknown)
        assert fenced.status_code == fenced_unknown.status_code == 200
        assert fenced.json() == {"id": key, "status": "aborted"}  # B's own (B, key), fenced
        assert fenced_unknown.json() == {"id": unknown, "status": "aborted"}
        assert fenced.headers["idempotency-status"] == fenced_unknown.headers["idempotency-status"]
        assert stable_headers(fenced).keys() == stable_headers(fenced_unknown).keys()
    assert_problem(b.create(key), 410, "transaction_aborted")  # fenced for B only
    assert_problem(b.lookup(key), 410, "transaction_aborted")
    if state == "approved":
        replay = a.create(key)
        assert replay.status_code == 201 and replay.headers["idempotent-replayed"] == "true"
        assert a.reverse(key).json()["status"] == "reversed"  # A still owns its transaction


@pytest.mark.parametrize("same_payload", [True, False], ids=["same-payload", "other-payload"])
def test_other_merchant_create_with_the_same_uuid_is_its_own_transaction(
    deployment: Deployment, tenants: Tenants, same_payload: bool
) -> None:
    a, b = tenants
    key = new_key()
    b_payload = body(amount=111) if same_payload else body(amount=222, terminal_id="T-B")
    a_first, b_first = a.create(key, body(amount=111)), b.create(key, b_payload)
    assert a_first.status_code == b_first.status_code == 201
    assert b_first.headers["idempotency-status"] == "created"  # never A's replay
    assert "idempotent-replayed" not in b_first.headers
    assert b_first.json()["amount"] == b_payload["amount"]
    a_again, b_again = a.create(key, body(amount=111)), b.create(key, b_payload)
    assert a_again.headers["idempotent-replayed"] == "true" and a_again.text == a_first.text
    assert b_again.headers["idempotent-replayed"] == "true" and b_again.text == b_first.text
    assert a.lookup(key).json()["amount"] == 111
    assert b.lookup(key).json()["amount"] == b_payload["amount"]
    assert _ledger(deployment, a.api_key, key) == [("charge", 111, "BRL")]
    assert _ledger(deployment, b.api_key, key) == [("charge", b_payload["amount"], "BRL")]


def test_keys_of_a_in_flight_are_invisible_and_untouchable_for_b(
    deployment: Deployment, tenants: Tenants
) -> None:
    """key1: the acquirer never answers A's offline sale (its advice is repeated; A's key stays
    processing); key2: A's 0200 goes unanswered, the create answers 202 and A's key settles
    declined / acquirer_timeout at the acquirer timeout. Meanwhile B looks up, reverses,
    creates and aborts the same UUIDs."""
    a, b = tenants
    key1, key2 = new_key(), new_key()
    captured = (datetime.now(UTC) - timedelta(minutes=1)).isoformat()
    down = body(card=card("tok_issuer_down"), entry_mode="offline", captured_at=captured)
    with ThreadPoolExecutor(2) as pool:
        first1 = pool.submit(a.create, key1, down)
        first2 = pool.submit(a.create, key2, body(card=card("tok_issuer_timeout")))
        assert first1.result().status_code == first2.result().status_code == 202
    _compare_lookup_and_reversal(b, key1)
    assert b.abort(key2).json() == {"id": key2, "status": "aborted"}
    created = b.create(key1)  # not 409: A's claim is A's
    assert created.status_code == 201 and created.headers["idempotency-status"] == "created"
    assert a.lookup(key1).status_code == 202  # A's key1 still in flight
    finished = eventually(
        lambda: a.lookup(key2),
        until=lambda lookup: lookup.status_code != 202,
        what="A's key2 settled at the acquirer timeout",
        timeout=15,
    )
    assert finished.status_code == 200, finished.text
    assert (finished.json()["status"], finished.json()["decline_reason"]) == (
        "declined",
        "acquirer_timeout",
    )
    assert _ledger(deployment, a.api_key, key2) == []  # declined: nothing charged
    assert _ledger(deployment, a.api_key, key1) == []
    assert a.lookup(key1).status_code == 202  # still in flight: never declined, never B's
    assert_problem(b.lookup(key2), 410, "transaction_aborted")
