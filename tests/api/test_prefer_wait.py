"""``Prefer: wait=N`` over HTTP on both backends (issue 17, contract §2): a duplicate create,
a lookup and an abort that find the key in flight are held until it settles — released on
the commit of the transaction, on the fence of a key the issuer never answered, or at
their time limit — and then answered as usual, with ``Preference-Applied``."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.support.backend import Backend
from tests.support.client import Api, assert_problem, body, card, new_key
from tests.support.eventually import eventually
from tests.support.services import Server

SLOW_S = 2.0


@pytest.fixture(scope="module")
def slow(backend: Backend) -> Iterator[tuple[Api, Server]]:
    """tok_issuer_slow answers after 2 s, well inside the 6 s issuer timeout and the 5 s
    deadline; tok_issuer_down is voided and fenced at that deadline."""
    server = backend.server(
        IDEMPAY_ISSUER_SLOW_SECONDS=str(SLOW_S),
        IDEMPAY_ISSUER_TIMEOUT="6",
        IDEMPAY_ISSUER_DEADLINE="5",
        IDEMPAY_COMPLETER_INTERVAL="0.2",
    )
    try:
        yield Api(server.url, backend.api_key("merchant-prefer-wait")), server
    finally:
        server.stop()


def _get(api: Api, path: str, **headers: str) -> httpx.Response:
    with api.client() as client:
        return client.get(path, headers=api.headers(None, **headers))


def _post(api: Api, path: str, **headers: str) -> httpx.Response:
    with api.client() as client:
        return client.post(path, headers=api.headers(None, **headers))


def _start_slow_create(api: Api, key: str, token: str = "tok_issuer_slow") -> threading.Thread:
    answers: list[httpx.Response] = []
    thread = threading.Thread(
        target=lambda: answers.append(api.create(key, body(card=card(token))))
    )
    thread.start()
    eventually(lambda: api.lookup(key).status_code == 202, what="the key in flight", timeout=30)
    return thread


def test_a_duplicate_create_waits_for_the_original_and_gets_its_replay(
    slow: tuple[Api, Server],
) -> None:
    api, _ = slow
    key = new_key()
    original = _start_slow_create(api, key, "tok_issuer_slow")
    without = api.create(key, body(card=card("tok_issuer_slow")))
    assert_problem(without, 409, "request_in_progress")  # as before, without the preference
    assert "preference-applied" not in without.headers
    waited = api.create(key, body(card=card("tok_issuer_slow")), Prefer="wait=20")
    original.join(30)
    assert waited.status_code == 201, waited.text
    assert waited.headers["idempotent-replayed"] == "true"
    assert waited.headers["idempotency-status"] == "replayed"
    assert waited.headers["preference-applied"] == "wait=20"
    assert waited.json()["status"] == "approved"
    assert waited.json() == api.lookup(key).json()


def test_lookups_and_aborts_waiting_on_one_key_are_released_by_its_commit(
    slow: tuple[Api, Server],
) -> None:
    api, _ = slow
    key = new_key()
    original = _start_slow_create(api, key)
    with ThreadPoolExecutor(6) as pool:
        lookups = [
            pool.submit(_get, api, f"/v1/transactions/{key}", Prefer="wait=20") for _ in range(5)
        ]
        abort = pool.submit(_post, api, f"/v1/transactions/{key}/abort", Prefer="wait=20")
        answers = [f.result() for f in lookups]
        aborted = abort.result()
    original.join(30)
    for answer in answers:
        assert answer.status_code == 200, answer.text
        assert answer.headers["idempotency-status"] == "processed"
        assert answer.headers["preference-applied"] == "wait=20"
        assert answer.json()["status"] == "approved"
    # the abort waited for the commit and tells the truth: processed, nothing fenced
    assert aborted.status_code == 200, aborted.text
    assert aborted.json()["status"] == "approved"
    assert aborted.headers["idempotency-status"] == "processed"


def test_a_lookup_waiting_on_a_key_the_issuer_never_answers_is_released_by_its_fence(
    slow: tuple[Api, Server],
) -> None:
    api, _ = slow
    key = new_key()
    original = _start_slow_create(api, key, "tok_issuer_down")
    answer = _get(api, f"/v1/transactions/{key}", Prefer="wait=20")
    original.join(30)
    assert_problem(answer, 410, "transaction_aborted")
    assert answer.headers["idempotency-status"] == "aborted"
    assert answer.headers["preference-applied"] == "wait=20"


def test_a_wait_shorter_than_the_work_answers_in_flight_at_its_limit(
    slow: tuple[Api, Server],
) -> None:
    api, _ = slow
    key = new_key()
    original = _start_slow_create(api, key)
    answer = _get(api, f"/v1/transactions/{key}", Prefer="wait=1")
    assert answer.status_code == 202, answer.text
    assert answer.json() == {"id": key, "status": "processing"}
    assert answer.headers["preference-applied"] == "wait=1"
    assert int(answer.headers["retry-after"]) >= 1
    original.join(30)
    assert api.lookup(key).status_code == 200


def test_no_wait_for_a_settled_or_unknown_key(slow: tuple[Api, Server]) -> None:
    api, _ = slow
    key = new_key()
    assert api.create(key).status_code == 201
    found = _get(api, f"/v1/transactions/{key}", Prefer="wait=20")
    assert found.status_code == 200
    assert "preference-applied" not in found.headers
    unknown = _get(api, f"/v1/transactions/{new_key()}", Prefer="wait=20")
    assert_problem(unknown, 404, "not_found")
    assert "preference-applied" not in unknown.headers
