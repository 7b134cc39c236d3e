"""contract §2 create: every row of the status table, on Postgres and on SQLite."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import httpx

from api.acquirer.host.store import summary
from tests.api.conftest import Deployment
from tests.support.client import assert_problem, body, card, new_key


def _wait_for(predicate, timeout: float = 15.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError("condition not reached in time")


def test_processes_new_key_and_stores_the_transaction(deployment: Deployment) -> None:
    key = new_key()
    response = deployment.a.create(key, body(amount=4321, installments=3))
    assert response.status_code == 201
    assert response.headers["idempotency-status"] == "created"
    assert "idempotent-replayed" not in response.headers
    assert response.headers["x-request-id"]
    txn = response.json()
    assert txn["id"] == key
    assert txn["status"] == "approved"
    assert txn["decline_reason"] is None
    assert len(txn["authorization_code"]) == 6
    assert (txn["amount"], txn["currency"], txn["installments"]) == (4321, "BRL", 3)
    assert txn["card"] == {"last4": "4242", "brand": "visa"}
    assert txn["type"] == "purchase" and txn["reversed_at"] is None
    assert txn["created_at"].endswith("Z") and txn["processed_at"].endswith("Z")
    assert deployment.count("transaction", id=key) == 1
    assert deployment.count("ledger_entry", transaction_id=key, kind="charge") == 1


def test_replays_completed_response_for_same_key(deployment: Deployment) -> None:
    key = new_key()
    first = deployment.a.create(key)
    second = deployment.a.create(key)
    assert second.status_code == 201
    assert second.headers["idempotent-replayed"] == "true"
    assert second.headers["idempotency-status"] == "replayed"
    assert second.content == first.content
    assert deployment.count("ledger_entry", transaction_id=key) == 1


def test_key_is_case_insensitive_and_may_be_quoted(deployment: Deployment) -> None:
    key = new_key()
    assert deployment.a.create(key.upper()).status_code == 201
    quoted = deployment.a.create(f'"{key}"')
    assert quoted.headers["idempotent-replayed"] == "true"
    assert quoted.json()["id"] == key


def test_omitted_defaults_fingerprint_like_explicit_ones(deployment: Deployment) -> None:
    key = new_key()
    deployment.a.create(key, body())
    again = deployment.a.create(key, body(type="purchase", installments=1, metadata={}))
    assert again.status_code == 201 and again.headers["idempotent-replayed"] == "true"


def test_declines_are_processed_stored_and_replayed(deployment: Deployment) -> None:
    for token, reason in [
        ("tok_decline_insufficient_funds", "insufficient_funds"),
        ("tok_decline_do_not_honor", "do_not_honor"),
    ]:
        key = new_key()
        first = deployment.a.create(key, body(card=card(token)))
        assert first.status_code == 201
        assert first.json()["status"] == "declined"
        assert first.json()["decline_reason"] == reason
        assert first.json()["authorization_code"] is None
        replay = deployment.a.create(key, body(card=card(token)))
        assert replay.content == first.content and replay.headers["idempotent-replayed"] == "true"
        assert deployment.count("transaction", id=key) == 1
        assert deployment.count("ledger_entry", transaction_id=key) == 0


def test_refund_posts_a_negative_ledger_entry(deployment: Deployment) -> None:
    key = new_key()
    response = deployment.a.create(key, body(type="refund", amount=700))
    assert response.status_code == 201 and response.json()["type"] == "refund"
    rows = deployment.backend.sql(
        "SELECT amount, kind FROM ledger_entry WHERE transaction_id = :k", k=key
    )
    assert [(row[0], row[1]) for row in rows] == [(-700, "refund")]


def test_slow_issuer_within_timeout_is_processed(deployment: Deployment) -> None:
    key = new_key()
    response = deployment.a.create(key, body(card=card("tok_issuer_slow")))
    assert response.status_code == 201
    assert response.json()["status"] == "approved"


def test_concurrent_duplicate_gets_409_while_in_progress(deployment: Deployment) -> None:
    key = new_key()
    payload = body(card=card("tok_issuer_slow"))
    results: list[httpx.Response] = []
    thread = threading.Thread(target=lambda: results.append(deployment.a.create(key, payload)))
    thread.start()
    _wait_for(lambda: deployment.a.lookup(key).status_code == 202)
    duplicate = deployment.a.create(key, payload)
    problem = assert_problem(duplicate, 409, "request_in_progress")
    assert duplicate.headers["retry-after"].isdigit()
    assert duplicate.headers["idempotency-status"] == "in_progress"
    assert problem["code"] == "request_in_progress"
    thread.join()
    # the original answers 201, or 202 when the loaded acquirer took past ANSWER_WITHIN (the
    # server then finishes it): either way the key is approved once
    assert results[0].status_code in (201, 202), results[0].text
    done = _wait_for(lambda: (r := deployment.a.lookup(key)).status_code == 200 and r, 30)
    assert done.json()["status"] == "approved"
    assert deployment.count("ledger_entry", transaction_id=key) == 1


def _settled_in_doubt(deployment: Deployment, key: str, payload: dict[str, object]) -> None:
    """The key ends declined / acquirer_timeout (no charge), its reversal advice queued and
    acknowledged, and the acquirer got exactly one 0200 for it — nothing approved there
    stays unreversed; a retry replays the decline."""
    done = _wait_for(lambda: (r := deployment.a.lookup(key)).status_code == 200 and r, 30)
    txn = done.json()
    assert (txn["status"], txn["decline_reason"]) == ("declined", "acquirer_timeout"), txn
    assert txn["authorization_code"] is None
    assert deployment.count("ledger_entry", transaction_id=key) == 0
    (rrn,) = deployment.backend.sql('SELECT rrn FROM "transaction" WHERE id = :k', k=key)[0]
    advice = deployment.backend.sql("SELECT kind, rrn FROM acquirer_advice WHERE key = :k", k=key)
    assert [tuple(row) for row in advice] == [("timeout", rrn)]
    _wait_for(
        lambda: deployment.backend.sql(
            "SELECT acknowledged_at FROM acquirer_advice WHERE key = :k", k=key
        )[0][0],
        30,
    )
    acquirer = summary(deployment.backend.tmp / "var" / "acquirer.sqlite3")[rrn]
    assert acquirer.requests == 1  # never a second 0200
    assert not acquirer.approved or acquirer.reversed  # nothing charged at the acquirer
    replay = deployment.a.create(key, payload)
    assert replay.status_code == 201 and replay.headers["idempotent-replayed"] == "true"
    assert replay.content == done.content


def test_issuer_timeout_answers_202_then_declines_acquirer_timeout_and_reverses(
    deployment: Deployment,
) -> None:
    """The acquirer approves but never answers the first 0200: 202, then the 0200 is in
    doubt — declined / acquirer_timeout, and the approval reversed by the queued advice."""
    key = new_key()
    payload = body(card=card("tok_issuer_timeout"))
    response = deployment.a.create(key, payload)
    assert response.status_code == 202
    assert response.json() == {"id": key, "status": "processing"}
    assert response.headers["idempotency-status"] == "in_progress"
    assert int(response.headers["retry-after"]) >= 1
    _settled_in_doubt(deployment, key, payload)
    rrn = deployment.backend.sql('SELECT rrn FROM "transaction" WHERE id = :k', k=key)[0][0]
    acquirer = summary(deployment.backend.tmp / "var" / "acquirer.sqlite3")[rrn]
    assert acquirer.approved and acquirer.reversed  # approved there, undone by the advice


def test_issuer_down_answers_202_then_declines_acquirer_timeout(deployment: Deployment) -> None:
    """The acquirer never answers: the key is not fenced but declined / acquirer_timeout;
    a late retry replays the decline."""
    key = new_key()
    payload = body(card=card("tok_issuer_down"))
    assert deployment.a.create(key, payload).status_code == 202
    _settled_in_doubt(deployment, key, payload)


def test_aborted_key_is_never_processed(deployment: Deployment) -> None:
    key = new_key()
    assert deployment.a.abort(key).json() == {"id": key, "status": "aborted"}
    response = deployment.a.create(key)
    assert_problem(response, 410, "transaction_aborted")
    assert response.headers["idempotency-status"] == "aborted"
    assert deployment.count("transaction", id=key) == 0


def test_expired_request_fences_the_key(deployment: Deployment) -> None:
    key = new_key()
    past = (datetime.now(UTC) - timedelta(seconds=5)).isoformat()
    response = deployment.a.create(key, body(expires_at=past))
    assert_problem(response, 410, "request_expired")
    assert response.headers["idempotency-status"] == "expired"
    again = deployment.a.create(key, body(expires_at=past))
    assert again.status_code == 410 and again.content == response.content
    assert deployment.a.create(key, body()).status_code == 410  # fenced whatever the payload
    assert deployment.count("transaction", id=key) == 0


def test_captured_at_older_than_retention_is_refused(deployment: Deployment) -> None:
    key = new_key()
    old = (datetime.now(UTC) - timedelta(days=36)).isoformat()
    response = deployment.a.create(key, body(captured_at=old))
    assert_problem(response, 410, "request_expired")
    assert deployment.count("transaction", id=key) == 0


def test_retry_after_expires_at_replays_what_was_processed_in_time(
    deployment: Deployment,
) -> None:
    key = new_key()
    payload = body(expires_at=(datetime.now(UTC) + timedelta(seconds=1)).isoformat())
    first = deployment.a.create(key, payload)
    assert first.status_code == 201
    time.sleep(1.2)
    replay = deployment.a.create(key, payload)
    assert replay.status_code == 201 and replay.content == first.content


def test_same_key_different_payload_is_422_and_changes_nothing(deployment: Deployment) -> None:
    key = new_key()
    first = deployment.a.create(key, body(amount=100))
    response = deployment.a.create(key, body(amount=101))
    assert_problem(response, 422, "idempotency_key_reused")
    assert response.headers["idempotency-status"] == "processed"
    assert deployment.a.lookup(key).content == first.content


def test_attempt_and_network_are_recorded_in_request_events(deployment: Deployment) -> None:
    key = new_key()
    deployment.a.create(
        key, body(terminal_id="T-EVT"), **{"Idempotency-Attempt": "1", "POS-Network": "gprs"}
    )
    deployment.a.create(
        key, body(terminal_id="T-EVT"), **{"Idempotency-Attempt": "2", "POS-Network": "gprs"}
    )
    deployment.a.lookup(key)
    rows = _wait_for(
        lambda: (
            (
                r := deployment.backend.sql(
                    "SELECT endpoint, outcome, http_status, attempt, network, terminal_id "
                    "FROM request_event WHERE idempotency_key = :k ORDER BY ts",
                    k=key,
                )
            )
            and len(r) == 3
            and r
        )
    )
    assert [tuple(row) for row in rows] == [
        ("create", "created", 201, 1, "gprs", "T-EVT"),
        ("create", "replayed", 201, 2, "gprs", "T-EVT"),
        ("lookup", "found", 200, None, None, "T-EVT"),
    ]
