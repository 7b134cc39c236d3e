"""contract §2 lookup, abort and reversal: every case, on Postgres and on SQLite."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import httpx

from tests.api.conftest import Deployment
from tests.support.client import assert_problem, body, card, new_key


def _processing(deployment: Deployment, key: str) -> tuple[threading.Thread, list[httpx.Response]]:
    """Start a slow create and return once the key is claimed (lookup says 202)."""
    results: list[httpx.Response] = []
    payload = body(card=card("tok_issuer_slow"))
    thread = threading.Thread(target=lambda: results.append(deployment.a.create(key, payload)))
    thread.start()
    for _ in range(100):
        if deployment.a.lookup(key).status_code == 202:
            return thread, results
        time.sleep(0.02)
    raise AssertionError("key never became processing")


def test_lookup_of_processed_key_returns_the_transaction(deployment: Deployment) -> None:
    key = new_key()
    created = deployment.a.create(key)
    found = deployment.a.lookup(key)
    assert found.status_code == 200
    assert found.headers["idempotency-status"] == "processed"
    assert found.json() == created.json()


def test_lookup_of_unknown_key_is_404_not_found(deployment: Deployment) -> None:
    response = deployment.a.lookup(new_key())
    assert_problem(response, 404, "not_found")
    assert response.headers["idempotency-status"] == "not_found"


def test_lookup_while_processing_is_202_with_retry_after(deployment: Deployment) -> None:
    key = new_key()
    thread, results = _processing(deployment, key)
    response = deployment.a.lookup(key)
    thread.join()
    if response.status_code == 202:  # the slow issuer may already have answered
        assert response.json() == {"id": key, "status": "processing"}
        assert response.headers["idempotency-status"] == "in_progress"
        assert response.headers["retry-after"].isdigit()
    else:
        assert response.status_code == 200
    assert results[0].status_code == 201


def test_lookup_of_fenced_keys_is_410(deployment: Deployment) -> None:
    aborted = new_key()
    deployment.a.abort(aborted)
    response = deployment.a.lookup(aborted)
    assert_problem(response, 410, "transaction_aborted")
    assert response.headers["idempotency-status"] == "aborted"
    expired = new_key()
    past = (datetime.now(UTC) - timedelta(minutes=1)).isoformat()
    deployment.a.create(expired, body(expires_at=past))
    response = deployment.a.lookup(expired)
    assert_problem(response, 410, "request_expired")
    assert response.headers["idempotency-status"] == "expired"


def test_lookup_abort_reversal_reject_a_non_uuid_id(deployment: Deployment) -> None:
    for call in (deployment.a.lookup, deployment.a.abort, deployment.a.reverse):
        assert_problem(call("not-a-uuid"), 400, "idempotency_key_invalid")


def test_abort_fences_an_unknown_key_idempotently(deployment: Deployment) -> None:
    key = new_key()
    first = deployment.a.abort(key)
    assert first.status_code == 200
    assert first.json() == {"id": key, "status": "aborted"}
    assert first.headers["idempotency-status"] == "aborted"
    second = deployment.a.abort(key)
    assert second.status_code == 200 and second.json() == first.json()
    assert deployment.count("idempotency_key", key=key, state="aborted") == 1


def test_abort_of_processed_key_tells_the_truth_and_changes_nothing(
    deployment: Deployment,
) -> None:
    key = new_key()
    created = deployment.a.create(key)
    response = deployment.a.abort(key)
    assert response.status_code == 200
    assert response.headers["idempotency-status"] == "processed"
    assert response.json() == created.json()
    assert deployment.a.create(key).headers["idempotent-replayed"] == "true"


def test_abort_while_processing_is_409(deployment: Deployment) -> None:
    key = new_key()
    thread, results = _processing(deployment, key)
    response = deployment.a.abort(key)
    thread.join()
    if response.status_code == 409:
        assert_problem(response, 409, "request_in_progress")
        assert response.headers["retry-after"].isdigit()
        assert response.headers["idempotency-status"] == "in_progress"
    else:  # the issuer answered first: the abort reports the processed transaction
        assert response.status_code == 200 and response.json()["status"] == "approved"
    # 201, or 202 on a loaded machine (the slow token's 0.8 s plus the claim and the finish
    # past IDEMPAY_ANSWER_WITHIN's 1.5 s): then the key ends approved by itself
    assert results[0].status_code in (201, 202), results[0].text
    if results[0].status_code == 202:
        for _ in range(300):
            found = deployment.a.lookup(key)
            if found.status_code == 200:
                break
            time.sleep(0.05)
        assert found.status_code == 200 and found.json()["status"] == "approved", found.text


def test_abort_of_expired_key_reports_it_fenced(deployment: Deployment) -> None:
    key = new_key()
    past = (datetime.now(UTC) - timedelta(minutes=1)).isoformat()
    deployment.a.create(key, body(expires_at=past))
    response = deployment.a.abort(key)
    assert response.status_code == 200
    assert response.json() == {"id": key, "status": "expired"}
    assert response.headers["idempotency-status"] == "expired"


def test_reversal_undoes_an_approval_exactly_once(deployment: Deployment) -> None:
    key = new_key()
    created = deployment.a.create(key, body(amount=999))
    first = deployment.a.reverse(key)
    assert first.status_code == 200
    reversed_txn = first.json()
    assert reversed_txn["status"] == "reversed" and reversed_txn["reversed_at"].endswith("Z")
    second = deployment.a.reverse(key)
    assert second.status_code == 200 and second.json() == reversed_txn
    rows = deployment.backend.sql(
        "SELECT kind, amount FROM ledger_entry WHERE transaction_id = :k ORDER BY kind", k=key
    )
    assert [tuple(row) for row in rows] == [("charge", 999), ("reversal", -999)]
    assert deployment.a.lookup(key).json()["status"] == "reversed"
    replay = deployment.a.create(key, body(amount=999))
    assert replay.content == created.content  # the stored answer is replayed unchanged


def test_reversal_of_declined_or_aborted_is_not_reversible(deployment: Deployment) -> None:
    declined = new_key()
    deployment.a.create(declined, body(card=card("tok_decline_do_not_honor")))
    assert_problem(deployment.a.reverse(declined), 422, "not_reversible")
    aborted = new_key()
    deployment.a.abort(aborted)
    assert_problem(deployment.a.reverse(aborted), 422, "not_reversible")


def test_reversal_of_unknown_is_404_and_in_progress_is_409(deployment: Deployment) -> None:
    assert_problem(deployment.a.reverse(new_key()), 404, "not_found")
    key = new_key()
    thread, _ = _processing(deployment, key)
    response = deployment.a.reverse(key)
    thread.join()
    if response.status_code == 409:
        assert_problem(response, 409, "request_in_progress")
    else:
        assert response.status_code == 200 and response.json()["status"] == "reversed"


def test_abort_wins_over_the_completer_once_the_server_owns_the_key(
    deployment: Deployment,
) -> None:
    """After the 202 the completer keeps re-driving an unresponsive issuer; the terminal's
    abort must not have to win a race against it: it takes the key, voids and fences."""
    key = new_key()
    payload = body(card=card("tok_issuer_down"))
    assert deployment.a.create(key, payload).status_code == 202
    time.sleep(0.6)  # past the issuer timeout of the claim: the server owns the key now
    started = time.monotonic()
    response = deployment.a.abort(key)
    assert response.status_code == 200, response.text
    assert response.json() == {"id": key, "status": "aborted"}
    assert time.monotonic() - started < 5
    assert_problem(deployment.a.create(key, payload), 410, "transaction_aborted")
    assert deployment.count("transaction", id=key) == 0
