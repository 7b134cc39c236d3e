"""contract §3.3: a server killed (SIGKILL) between phases loses nothing acknowledged and leaves
no key stuck; retries with the same keys end with exactly one charge each."""

from __future__ import annotations

import contextlib
import threading
import time

import httpx

from api.auth import hash_key
from api.config import Settings
from api.transactions.issuer import derive_issuer_key
from tests.support.backend import Backend
from tests.support.client import Api, body, card, new_key

SLOW = body(card=card("tok_issuer_slow"), terminal_id="T-CRASH")
CRASH_ENV = {  # the issuer slow enough that 12 sequential lookups on a loaded machine all
    # see the keys still in phase 2 before the kill (2 s once let 5 of 12 finish first)
    "IDEMPAY_ISSUER_SLOW_SECONDS": "5",
    "IDEMPAY_ISSUER_TIMEOUT": "8",
    "IDEMPAY_ISSUER_DEADLINE": "60",
    "IDEMPAY_LEASE_SECONDS": "3",
}


STUCK = (
    "SELECT count(*) FROM idempotency_key WHERE state = 'processing' AND terminal_id = 'T-CRASH'"
)


def _fire_and_forget(api: Api, key: str) -> None:
    with contextlib.suppress(httpx.HTTPError):  # the server dies under it: in doubt
        api.create(key, SLOW)


def test_sigkill_between_phases_then_retries_charge_exactly_once(
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
    deadline = time.monotonic() + 40
    while len(results) < len(keys):
        assert time.monotonic() < deadline, "keys stuck after restart"
        for key in keys:
            if key not in results:
                response = api.create(key, SLOW)
                assert response.status_code in (201, 202, 409), response.text
                if response.status_code == 201:
                    results[key] = response
        time.sleep(0.2)
    restarted.stop()

    for key in keys:
        assert results[key].json()["status"] == "approved"
        charges = backend.sql(
            "SELECT count(*) FROM ledger_entry WHERE transaction_id = :k AND kind = 'charge'", k=key
        )[0][0]
        assert charges == 1, key
    assert backend.sql(STUCK)[0][0] == 0
    # The issuer saw the re-drive under the same derived key and authorized once per key.
    merchant_id = backend.sql(
        "SELECT merchant_id FROM api_key WHERE key_hash = :h", h=hash_key(api.api_key)
    )[0][0]
    for key in keys:
        issuer_key = derive_issuer_key(Settings().secret_key, merchant_id, key)
        rows = backend.sql(
            "SELECT result, calls FROM issuer_authorization WHERE issuer_key = :i", i=issuer_key
        )
        assert len(rows) == 1 and rows[0][0] == "approved" and rows[0][1] >= 2, rows
