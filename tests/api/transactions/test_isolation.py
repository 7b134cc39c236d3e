"""contract §2 tenancy: a key is (merchant, UUID); merchant B can never see or touch A's."""

from __future__ import annotations

from tests.api.conftest import Deployment
from tests.support.client import body, new_key


def _same_problem(one: dict[str, object], other: dict[str, object]) -> bool:
    return all(one[field] == other[field] for field in ("type", "title", "status", "code"))


def test_other_merchant_lookup_and_reversal_look_exactly_like_unknown(
    deployment: Deployment,
) -> None:
    key = new_key()
    assert deployment.a.create(key).status_code == 201
    unknown = new_key()
    for call in ("lookup", "reverse"):
        theirs = getattr(deployment.b, call)(key)
        nothing = getattr(deployment.b, call)(unknown)
        assert theirs.status_code == nothing.status_code == 404
        assert _same_problem(theirs.json(), nothing.json())
        assert theirs.json()["detail"] == nothing.json()["detail"]
    assert deployment.a.lookup(key).json()["status"] == "approved"


def test_same_uuid_is_independent_per_merchant(deployment: Deployment) -> None:
    key = new_key()
    a = deployment.a.create(key, body(amount=100))
    b = deployment.b.create(key, body(amount=200))  # different payload: not a reuse for B
    assert a.status_code == b.status_code == 201
    assert "idempotent-replayed" not in b.headers
    assert b.json()["amount"] == 200 and a.json()["amount"] == 100
    assert deployment.count("transaction", id=key) == 2
    assert deployment.count("ledger_entry", transaction_id=key, kind="charge") == 2


def test_other_merchant_abort_fences_only_its_own_key(deployment: Deployment) -> None:
    key = new_key()
    created = deployment.a.create(key)
    fenced = deployment.b.abort(key)
    assert fenced.status_code == 200 and fenced.json() == {"id": key, "status": "aborted"}
    assert deployment.a.lookup(key).json() == created.json()
    assert deployment.a.create(key).headers["idempotent-replayed"] == "true"
    assert deployment.b.create(key).status_code == 410


def test_other_merchant_cannot_reverse(deployment: Deployment) -> None:
    key = new_key()
    deployment.a.create(key)
    assert deployment.b.reverse(key).status_code == 404
    assert deployment.a.lookup(key).json()["status"] == "approved"
    assert deployment.count("ledger_entry", transaction_id=key, kind="reversal") == 0
