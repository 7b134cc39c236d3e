"""contract §3.3: a server killed (SIGKILL) between phases — every key claimed, its one 0200
out at the acquirer — loses nothing acknowledged and leaves no key stuck. The 0200s may have
been approved (they were: the host decides, then answers tok_issuer_slow late), so none is
ever sent again: after the restart each key ends declined / acquirer_timeout with no charge,
its reversal advice is acknowledged, and the acquirer holds one 0200 per key, reversed."""

from __future__ import annotations

import contextlib
import threading
import time

import httpx

from api.acquirer.host.store import net_approvals, summary
from tests.support.backend import Backend
from tests.support.client import Api, body, card, new_key
from tests.support.eventually import eventually

SLOW = body(card=card("tok_issuer_slow"), terminal_id="T-CRASH")
CRASH_ENV = {  # the acquirer slow enough that 12 sequential lookups on a loaded machine all
    # see the keys still in phase 2 before the kill (2 s once let 5 of 12 finish first, 5 s
    # 10 of 12 at load 30), and the 0200's timeout longer than that, so it is the kill that
    # leaves them in doubt
    "IDEMPAY_ACQUIRER_SLOW_SECONDS": "15",
    "IDEMPAY_ANSWER_WITHIN": "25",
    "IDEMPAY_ACQUIRER_TIMEOUT": "20",
    "IDEMPAY_ISSUER_DEADLINE": "60",
    "IDEMPAY_LEASE_SECONDS": "3",
}


STUCK = (
    "SELECT count(*) FROM idempotency_key WHERE state = 'processing' AND terminal_id = 'T-CRASH'"
)
PENDING_ADVICES = (
    "SELECT count(*) FROM acquirer_advice WHERE acknowledged_at IS NULL AND terminal_id = 'T-CRASH'"
)


def _fire_and_forget(api: Api, key: str) -> None:
    with contextlib.suppress(httpx.HTTPError):  # the server dies under it: in doubt
        api.create(key, SLOW)


def test_sigkill_between_phases_then_retries_settle_each_key_declined_once_and_reverse_it(
    private_backend: Backend,
) -> None:
    backend = private_backend  # no other server's completer may recover these keys first
    server = backend.server(**CRASH_ENV)
    api = Api(server.url, backend.api_key(f"merchant-crash-{backend.name}"))
    keys = [new_key() for _ in range(12)]
    threads = [threading.Thread(target=_fire_and_forget, args=(api, key)) for key in keys]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 30  # generous: the machine is shared and noisy
    while any(api.lookup(key).status_code != 202 for key in keys):  # all claimed, in phase 2
        assert time.monotonic() < deadline
        time.sleep(0.05)
    server.kill()
    for thread in threads:
        thread.join(10)
    stuck = backend.sql(STUCK)[0][0]
    assert stuck == len(keys)  # killed between phases: claimed, nothing finished

    restarted = backend.server(**CRASH_ENV)
    api = Api(restarted.url, api.api_key)
    results: dict[str, httpx.Response] = {}
    deadline = time.monotonic() + 120  # the dead owner's lease (20 + 3 s) runs out first
    try:
        while len(results) < len(keys):
            assert time.monotonic() < deadline, "keys stuck after restart"
            for key in keys:
                if key not in results:
                    response = api.create(key, SLOW)
                    assert response.status_code in (201, 202, 409), response.text
                    if response.status_code == 201:
                        results[key] = response
            time.sleep(0.2)
        eventually(
            lambda: backend.sql(PENDING_ADVICES)[0][0] == 0, what="every advice's 0430",
            timeout=60,
        )  # fmt: skip
    finally:
        restarted.stop()

    for key in keys:
        txn = results[key].json()
        assert (txn["status"], txn["decline_reason"]) == ("declined", "acquirer_timeout"), txn
        charges = backend.sql(
            "SELECT count(*) FROM ledger_entry WHERE transaction_id = :k AND kind = 'charge'", k=key
        )[0][0]
        assert charges == 0, key
    assert backend.sql(STUCK)[0][0] == 0
    rows = backend.sql(
        'SELECT t.rrn, a.kind FROM "transaction" t JOIN acquirer_advice a'
        " ON a.merchant_id = t.merchant_id AND a.key = t.id WHERE t.terminal_id = 'T-CRASH'"
    )
    assert sorted(kind for _, kind in rows) == ["timeout"] * len(keys)  # one advice per key
    rrns = {rrn for rrn, _ in rows}
    # The acquirer saw one 0200 per key, ever (no re-drive), approved it, and the advice
    # reversed it: nothing is charged there that idempay declined.
    store = backend.tmp / "var" / "acquirer.sqlite3"
    seen = summary(store)
    for rrn in rrns:
        assert (seen[rrn].requests, seen[rrn].approved, seen[rrn].reversed) == (1, True, True)
    assert not rrns & net_approvals(store)
