"""``Prefer: wait=N`` over HTTP on both backends (issue 17, contract §2): a duplicate create,
a lookup and an abort that find the key in flight are held until it settles — released on
the commit of the transaction (for a key the acquirer never answers: its in-doubt
settlement, declined / acquirer_timeout), on a fence, or at their time limit — and then
answered as usual, with ``Preference-Applied``."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
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
    """tok_issuer_slow answers after 2 s, well inside the 5 s acquirer timeout and the 6 s
    answer time; tok_issuer_down's 0200 is in doubt at that timeout: declined /
    acquirer_timeout."""
    with _own_server(
        backend,
        "merchant-prefer-wait",
        IDEMPAY_ACQUIRER_SLOW_SECONDS=str(SLOW_S),
        IDEMPAY_ANSWER_WITHIN="6",
        IDEMPAY_ACQUIRER_TIMEOUT="5",
        IDEMPAY_ISSUER_DEADLINE="5",
        IDEMPAY_COMPLETER_INTERVAL="0.2",
    ) as api_and_server:
        yield api_and_server


def _get(api: Api, path: str, **headers: str) -> httpx.Response:
    with api.client() as client:
        return client.get(path, headers=api.headers(None, **headers))


def _post(api: Api, path: str, **headers: str) -> httpx.Response:
    with api.client() as client:
        return client.post(path, headers=api.headers(None, **headers))


@contextlib.contextmanager
def _own_server(backend: Backend, merchant: str, **env: str) -> Iterator[tuple[Api, Server]]:
    """A server of the test's own (``env``: its settings) and a merchant on it; stopped
    after the test, unless the test stopped it itself."""
    server = backend.server(**env)
    try:
        yield Api(server.url, backend.api_key(merchant)), server
    finally:
        server.stop()


def _wait_lookup(api: Api, key: str, seconds: int) -> httpx.Response:
    return _get(api, f"/v1/transactions/{key}", Prefer=f"wait={seconds}")


def _wait_abort(api: Api, key: str, seconds: int) -> httpx.Response:
    return _post(api, f"/v1/transactions/{key}/abort", Prefer=f"wait={seconds}")


def _in_flight(api: Api, token: str = "tok_issuer_slow") -> tuple[str, threading.Thread]:
    """A new key whose create (``token``'s issuer behaviour) is in flight now, and the
    thread sending it."""
    key = new_key()
    return key, _start_slow_create(api, key, token)


def _start_slow_create(api: Api, key: str, token: str = "tok_issuer_slow") -> threading.Thread:
    answers: list[httpx.Response] = []

    def send() -> None:
        with contextlib.suppress(httpx.HTTPError):  # a server stopped under it (SIGTERM test)
            answers.append(api.create(key, body(card=card(token))))

    thread = threading.Thread(target=send)
    thread.start()
    eventually(lambda: api.lookup(key).status_code == 202, what="the key in flight", timeout=30)
    return thread


def test_a_duplicate_create_waits_for_the_original_and_gets_its_replay(
    slow: tuple[Api, Server],
) -> None:
    api, _ = slow
    key, original = _in_flight(api)
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
    key, original = _in_flight(api)
    with ThreadPoolExecutor(6) as pool:
        lookups = [pool.submit(_wait_lookup, api, key, 20) for _ in range(5)]
        abort = pool.submit(_wait_abort, api, key, 20)
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


def test_a_lookup_waiting_on_a_key_the_acquirer_never_answers_is_released_by_its_settlement(
    slow: tuple[Api, Server],
) -> None:
    api, _ = slow
    key, original = _in_flight(api, "tok_issuer_down")
    answer = _wait_lookup(api, key, 20)
    original.join(30)
    assert answer.status_code == 200, answer.text
    txn = answer.json()
    assert (txn["status"], txn["decline_reason"]) == ("declined", "acquirer_timeout")
    assert answer.headers["idempotency-status"] == "processed"
    assert answer.headers["preference-applied"] == "wait=20"


def test_a_wait_shorter_than_the_work_answers_in_flight_at_its_limit(
    slow: tuple[Api, Server],
) -> None:
    api, _ = slow
    key, original = _in_flight(api)
    answer = _wait_lookup(api, key, 1)
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
    found = _wait_lookup(api, key, 20)
    assert found.status_code == 200
    assert "preference-applied" not in found.headers
    unknown = _wait_lookup(api, new_key(), 20)
    assert_problem(unknown, 404, "not_found")
    assert "preference-applied" not in unknown.headers


# ---------------------------------------------------------------- the review's findings
# (a hostile review of the first version; each test failed on it)

# tok_issuer_down's 0200 waits a minute before it is in doubt: in these tests nothing but the
# abort, the fence or SIGTERM ends the wait (else the key settles declined while they run)
_NEVER_IN_DOUBT = {"IDEMPAY_ACQUIRER_TIMEOUT": "60"}


def test_an_abort_waiting_past_the_grace_fences_then_instead_of_at_its_limit(
    backend: Backend,
) -> None:
    """The abort's 409 turns into a fence once the claim's answer time (+0.5 s) passes —
    no settlement announces that: the waiter looks again then. (Before: it waited out its
    limit, then answered from a look made there.)"""
    settings = {
        **_NEVER_IN_DOUBT,
        "IDEMPAY_ANSWER_WITHIN": "1",
        "IDEMPAY_COMPLETER_ENABLED": "false",
    }
    with _own_server(backend, "merchant-wait-abort", **settings) as (api, _):
        key, original = _in_flight(api, "tok_issuer_down")
        aborted = _wait_abort(api, key, 20)
        original.join(30)
    assert aborted.status_code == 200, aborted.text
    assert aborted.json() == {"id": key, "status": "aborted"}
    assert aborted.headers["preference-applied"] == "wait=20"


def test_sigterm_answers_the_waiting_requests_with_their_last_look(backend: Backend) -> None:
    """SIGTERM while requests wait: they answer at once, in flight, as the contract writes
    them (before: uvicorn's graceful shutdown waited 10 s, then cut them with a bare 500
    without X-Request-Id)."""
    settings = {**_NEVER_IN_DOUBT, "IDEMPAY_ANSWER_WITHIN": "30", "IDEMPAY_ISSUER_DEADLINE": "60"}
    with (
        _own_server(backend, "merchant-wait-sigterm", **settings) as (api, server),
        ThreadPoolExecutor(4) as pool,
    ):
        key, original = _in_flight(api, "tok_issuer_down")
        waiting = [pool.submit(_wait_lookup, api, key, 20) for _ in range(3)]
        waiting.append(pool.submit(_wait_abort, api, key, 20))
        threading.Event().wait(1.0)  # they are held (nothing settles this key for 30 s)
        server.stop()  # SIGTERM, then the graceful shutdown
        answers = [f.result() for f in waiting]
    original.join(60)
    for answer in answers[:3]:
        assert answer.status_code == 202, answer.text
        assert answer.json() == {"id": key, "status": "processing"}
        assert answer.headers["idempotency-status"] == "in_progress"
        assert answer.headers["x-request-id"]
        assert answer.headers["preference-applied"] == "wait=20"
    assert_problem(answers[3], 409, "request_in_progress")


def test_a_client_that_hangs_up_gives_its_waiting_slot_back(backend: Backend) -> None:
    """IDEMPAY_WAITERS_MAX=1: the one waiter hangs up after 1 s; the slot is free again
    long before its 20 s (before: held until the key settled or the limit)."""
    settings = {
        **_NEVER_IN_DOUBT,
        "IDEMPAY_ANSWER_WITHIN": "30",
        "IDEMPAY_ISSUER_DEADLINE": "60",
        "IDEMPAY_WAITERS_MAX": "1",
    }
    with _own_server(backend, "merchant-wait-hangup", **settings) as (api, server):
        key, original = _in_flight(api, "tok_issuer_down")
        headers = api.headers(None, Prefer="wait=20")
        with (
            httpx.Client(base_url=server.url, timeout=1.0) as impatient,
            pytest.raises(httpx.ReadTimeout),
        ):
            impatient.get(f"/v1/transactions/{key}", headers=headers)

        def slot_free() -> bool:
            answer = _wait_lookup(api, key, 1)
            return answer.headers.get("preference-applied") == "wait=1"

        eventually(slot_free, what="the hung-up waiter's slot back", timeout=10)
    original.join(60)


def test_sqlite_sees_a_fence_made_by_another_process(private_sqlite_backend: Backend) -> None:
    """SQLite has no NOTIFY: a key fenced by the CLI (another process) is seen by the
    waiter's once-a-second look (before: it waited out its limit and answered 202)."""
    backend = private_sqlite_backend
    settings = {
        **_NEVER_IN_DOUBT,
        "IDEMPAY_ANSWER_WITHIN": "1",
        "IDEMPAY_COMPLETER_ENABLED": "false",
        "IDEMPAY_PREFER_WAIT_MAX": "90",  # the CLI may take long to start on a loaded machine
    }
    with _own_server(backend, "merchant-wait-cli", **settings) as (api, _):
        key, original = _in_flight(api, "tok_issuer_down")
        original.join(30)  # answered 202: its 0200 still out, nothing settles the key
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(_wait_lookup, api, key, 90)
            threading.Event().wait(0.5)
            fenced = subprocess.run(
                [sys.executable, "-m", "api", "admin", "key", "fence", "merchant-wait-cli",
                 key, "--reason", "test"],
                # the operator's command runs with the deployment's settings, like the server
                env={**os.environ, **backend.env, **settings},
                capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            assert fenced.returncode == 0, fenced.stdout + fenced.stderr
            answer = waiting.result()
    assert_problem(answer, 410, "transaction_aborted")
    assert answer.headers["preference-applied"] == "wait=90"
