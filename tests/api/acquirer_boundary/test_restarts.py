"""Restarts on both sides of the link, with real processes (contract §3.3, §2.9, §8): the
server killed between the claim and the 0200 and between the 0200 and its answer, the
acquirer killed with advices queued, a server stopped (SIGTERM) with 0200s in flight, and
two servers sending the same keys to one acquirer."""

from __future__ import annotations

import contextlib
import threading

import httpx

from tests.api.acquirer_boundary.conftest import Rig
from tests.support.client import Api, new_key
from tests.support.eventually import eventually

TIMEOUT = "acquirer_timeout"


def _fire(api: Api, key: str) -> threading.Thread:
    def run() -> None:
        with contextlib.suppress(httpx.HTTPError):  # the server may die under it
            api.create(key)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _declined_in_doubt(rig: Rig, api: Api, key: str) -> None:
    txn = rig.settled(api, key)
    assert txn["status"] == "declined" and txn["decline_reason"] == TIMEOUT, txn
    assert rig.acknowledged(key)["rrn"] == rig.rrn(key)


def test_server_killed_between_claim_and_0200(rig: Rig) -> None:
    server = rig.server()
    api = rig.api(server)
    rig.acquirer.control(down=True)  # the link has no connection: the 0200 waits for one
    key = new_key()
    thread = _fire(api, key)
    claimed = eventually(lambda: api.lookup(key).status_code, what="the key claimed",
                         until=lambda s: s != 404)  # fmt: skip
    assert claimed == 202
    server.kill()  # claimed, and its 0200 not written
    thread.join(10)
    assert rig.key_state(key) == "processing"
    assert rig.at_acquirer(key) is None
    rig.acquirer.control(down=False)
    again = rig.server()
    api = rig.api(again)
    # the completer cannot prove nothing left: declined + advice, never a 0200
    _declined_in_doubt(rig, api, key)
    seen = rig.at_acquirer(key)
    assert seen is not None and seen.requests == 0 and not seen.approved
    assert "0200" not in [m["mti"] for m in rig.messages(key)]
    assert api.create(key).json()["decline_reason"] == TIMEOUT  # a retry: the replay
    assert rig.at_acquirer(key).requests == 0  # type: ignore[union-attr]
    rig.assert_books_match()


def test_server_killed_between_0200_and_answer(rig: Rig) -> None:
    server = rig.server()
    api = rig.api(server)
    rig.acquirer.control(latency_ms=8000)  # decided at once, answered 8 s later
    key = new_key()
    thread = _fire(api, key)
    assert rig.received(key).approved
    server.kill()
    thread.join(10)
    assert rig.key_state(key) == "processing"
    rig.acquirer.control(latency_ms=0)
    again = rig.server()
    api = rig.api(again)
    _declined_in_doubt(rig, api, key)
    rig.assert_net_zero(key)  # one 0200, approved and reversed by the advice
    assert api.create(key).json()["decline_reason"] == TIMEOUT
    assert rig.at_acquirer(key).requests == 1  # type: ignore[union-attr]
    rig.assert_books_match()


def test_acquirer_killed_with_advices_queued_drains_after_it_is_back(rig: Rig) -> None:
    server = rig.server()
    api = rig.api(server)
    rig.acquirer.control(drop_answer=1.0)
    keys = [new_key() for _ in range(5)]
    threads = [_fire(api, key) for key in keys]
    for key in keys:
        assert rig.received(key).approved
    port = rig.acquirer.port
    rig.acquirer.kill()  # the link's connections break: every 0200 in doubt
    for thread in threads:
        thread.join(15)
    for key in keys:
        txn = rig.settled(api, key)
        assert txn["decline_reason"] == TIMEOUT
    # queued, tried while the acquirer is gone, not acknowledged
    eventually(
        lambda: [rig.advice(k) for k in keys],
        what="every advice tried at least once",
        until=lambda advices: all(a is not None and a["attempts"] >= 1 for a in advices),
    )
    assert rig.pending_advices() == len(keys)
    host = rig.start_acquirer_again("--seed", "2")  # same store, same port, no faults
    assert host.port == port
    for key in keys:
        rig.acknowledged(key, timeout=90)  # backoff doubles to a minute at most
        rig.assert_net_zero(key)
    rig.assert_books_match()


def test_sigterm_with_0200s_in_flight_leaves_nothing_charged_and_nothing_stuck(
    rig: Rig,
) -> None:
    env = {"IDEMPAY_ACQUIRER_TIMEOUT": "8"}  # the shutdown drains 5 s, then closes the link
    server = rig.server(**env)
    api = rig.api(server)
    rig.acquirer.control(latency_ms=7000)
    keys = [new_key() for _ in range(4)]
    threads = [_fire(api, key) for key in keys]
    for key in keys:
        assert rig.received(key).approved
    server.stop(timeout=30)
    for thread in threads:
        thread.join(15)
    assert not server.alive()
    rig.acquirer.control(latency_ms=0)
    again = rig.server(**env)
    api = rig.api(again)
    for key in keys:
        _declined_in_doubt(rig, api, key)
        rig.assert_net_zero(key)
    rig.assert_books_match()


def test_two_servers_one_acquirer_same_keys_one_0200_each(rig: Rig) -> None:
    one, two = rig.server(), rig.server()
    apis = [rig.api(one), rig.api(two)]
    rig.acquirer.control(latency_ms=300, jitter_ms=300)  # the two sends overlap
    keys = [new_key() for _ in range(12)]
    results: dict[tuple[str, int], int] = {}

    def send(key: str, i: int) -> None:
        with contextlib.suppress(httpx.HTTPError):
            results[(key, i)] = apis[i].create(key).status_code

    threads = [threading.Thread(target=send, args=(k, i)) for k in keys for i in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert set(results.values()) <= {201, 202, 409}, results
    for key in keys:
        txn = rig.settled(apis[0], key)
        assert txn["status"] == "approved", txn
        assert rig.settled(apis[1], key) == txn
        seen = rig.at_acquirer(key)
        assert seen is not None and seen.requests == 1, seen
    rig.assert_books_match()
