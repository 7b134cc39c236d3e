"""contract §2.2, offline advices (issue 16): a payment the terminal accepted offline and
forwards later as ``"entry_mode": "offline"``, on Postgres and on SQLite.

Processed exactly once like any create; exempt from ``expires_at``, not from the retention
window (422 ``advice_too_old``, nothing stored); the transaction says ``offline``."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from tests.api.conftest import Deployment
from tests.support.client import assert_problem, body, card, new_key


def _now(**delta: float) -> str:
    return (datetime.now(UTC) + timedelta(**delta)).isoformat().replace("+00:00", "Z")


def advice(**overrides: object) -> dict[str, object]:
    return body(**{"entry_mode": "offline", "captured_at": _now(minutes=-30), **overrides})


def test_an_advice_is_processed_once_and_says_offline(deployment: Deployment) -> None:
    key, captured = new_key(), _now(minutes=-30)
    first = deployment.a.create(key, advice(captured_at=captured))
    assert first.status_code == 201, first.text
    assert first.headers["idempotency-status"] == "created"
    assert first.json()["offline"] is True and first.json()["status"] == "approved"
    replay = deployment.a.create(key, advice(captured_at=captured))
    assert replay.status_code == 201 and replay.headers["idempotent-replayed"] == "true"
    assert replay.content == first.content
    looked = deployment.a.lookup(key)
    assert looked.status_code == 200 and looked.json() == first.json()
    assert deployment.count("transaction", id=key) == 1
    assert deployment.count("ledger_entry", transaction_id=key, kind="charge") == 1
    [(offline,)] = deployment.backend.sql('SELECT offline FROM "transaction" WHERE id = :k', k=key)
    assert bool(offline) is True


def test_an_online_create_says_offline_false(deployment: Deployment) -> None:
    key = new_key()
    created = deployment.a.create(key, body())
    assert created.status_code == 201 and created.json()["offline"] is False
    assert deployment.a.lookup(key).json()["offline"] is False
    explicit = deployment.a.create(key, body(entry_mode="online"))
    assert explicit.headers["idempotent-replayed"] == "true"  # the default, fingerprinted alike


def test_entry_mode_is_part_of_the_fingerprint(deployment: Deployment) -> None:
    key, captured = new_key(), _now(minutes=-1)
    assert deployment.a.create(key, body(captured_at=captured)).status_code == 201
    other = deployment.a.create(key, body(captured_at=captured, entry_mode="offline"))
    assert_problem(other, 422, "idempotency_key_reused")
    assert deployment.count("transaction", id=key) == 1


def test_an_advice_is_exempt_from_expires_at(deployment: Deployment) -> None:
    key = new_key()
    response = deployment.a.create(key, advice(expires_at=_now(minutes=-29)))
    assert response.status_code == 201, response.text
    assert response.json()["offline"] is True
    online = deployment.a.create(new_key(), body(expires_at=_now(minutes=-29)))
    assert_problem(online, 410, "request_expired")


def test_an_advice_older_than_the_retention_window_is_refused_and_nothing_stored(
    deployment: Deployment,
) -> None:
    key = new_key()
    old = advice(captured_at=_now(days=-36))
    problem = assert_problem(deployment.a.create(key, old), 422, "advice_too_old")
    assert "retention" in problem["detail"]
    assert deployment.count("idempotency_key", key=key) == 0
    assert deployment.count("transaction", id=key) == 0
    assert_problem(deployment.a.lookup(key), 404, "not_found")
    # the same refusal again: still nothing stored, never fenced as expired
    assert_problem(deployment.a.create(key, old), 422, "advice_too_old")
    assert deployment.count("idempotency_key", key=key) == 0


def test_an_advice_under_a_key_minted_before_the_window_is_too_old(
    deployment: Deployment,
) -> None:
    minted = int((datetime.now(UTC) - timedelta(days=40)).timestamp() * 1000)
    key = str(uuid.UUID(int=(minted << 80) | (0x7 << 76) | (0b10 << 62) | 12345))
    assert_problem(deployment.a.create(key, advice()), 422, "advice_too_old")


def test_an_advice_needs_its_captured_at(deployment: Deployment) -> None:
    problem = assert_problem(
        deployment.a.create(new_key(), body(entry_mode="offline")), 422, "validation_error"
    )
    assert "captured_at" in str(problem["errors"])
    bad = assert_problem(
        deployment.a.create(new_key(), advice(entry_mode="stored")), 422, "validation_error"
    )
    assert bad["errors"][0]["loc"] == ["entry_mode"]


def test_an_advice_from_the_future_is_clock_skew(deployment: Deployment) -> None:
    response = deployment.a.create(new_key(), advice(captured_at=_now(hours=1)))
    assert_problem(response, 422, "clock_skew")


def test_an_issuer_decline_of_an_advice_is_declined_offline(deployment: Deployment) -> None:
    key = new_key()
    response = deployment.a.create(key, advice(card=card("tok_decline_insufficient_funds")))
    assert response.status_code == 201
    txn = response.json()
    assert (txn["status"], txn["decline_reason"], txn["offline"]) == (
        "declined",
        "insufficient_funds",
        True,
    )
    assert deployment.count("ledger_entry", transaction_id=key) == 0
    assert deployment.a.lookup(key).json()["offline"] is True


def test_an_advice_on_the_general_path_says_offline(deployment: Deployment) -> None:
    """A token the issuer does not answer inline (the claim, issuer call, finish path)."""
    key = new_key()
    response = deployment.a.create(key, advice(card=card("tok_issuer_slow")))
    assert response.status_code == 201, response.text
    assert response.json()["offline"] is True
    assert deployment.a.lookup(key).json()["offline"] is True


def test_another_merchant_cannot_see_an_advice(deployment: Deployment) -> None:
    key = new_key()
    assert deployment.a.create(key, advice()).status_code == 201
    assert_problem(deployment.b.lookup(key), 404, "not_found")
