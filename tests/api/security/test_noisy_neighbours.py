"""One merchant cannot starve another's payments of the shared completer (issue 23, item 2;
docs/security.md, "Noisy neighbours")."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.support.backend import Backend
from tests.support.client import Api, body, card, new_key
from tests.support.eventually import eventually

FLOOD_CONNECTIONS = 60


def _flood(api: Api, stop: threading.Event) -> int:
    """Creates whose issuer never answers, back to back, until told to stop."""
    sent = 0
    with httpx.Client(base_url=api.base_url, timeout=30) as client:
        while not stop.is_set():
            client.post(
                "/v1/transactions",
                json=body(terminal_id="T-FLOOD", card=card("tok_issuer_down")),
                headers=api.headers(new_key()),
            )
            sent += 1
    return sent


def test_a_flood_of_unanswered_payments_does_not_starve_another_merchant(
    private_pg_backend: Backend,
) -> None:
    """Merchant A floods ``tok_issuer_down`` creates: each one's re-drive holds a completer
    slot for the issuer timeout until its deadline. Merchant B's ``tok_issuer_timeout``
    payment (202, then answered by the issuer on the completer's first re-drive) must still
    be approved — not voided and aborted at its deadline behind A's backlog."""
    backend = private_pg_backend
    server = backend.server(IDEMPAY_DB_POOL_SIZE="24")
    noisy = Api(server.url, backend.api_key("merchant-noisy"))
    victim = Api(server.url, backend.api_key("merchant-victim"))
    stop = threading.Event()
    try:
        with ThreadPoolExecutor(FLOOD_CONNECTIONS) as pool:
            floods = [pool.submit(_flood, noisy, stop) for _ in range(FLOOD_CONNECTIONS)]
            try:
                backlog = eventually(
                    lambda: backend.sql(
                        "SELECT count(*) FROM idempotency_key WHERE state = 'processing'"
                    )[0][0],
                    until=lambda processing: processing >= 150,
                    what="a backlog of 150 of A's keys waiting for the completer",
                    timeout=120,
                    interval=0.2,
                )
                key = new_key()
                created = victim.create(key, body(card=card("tok_issuer_timeout")))
                assert created.status_code == 202, created.text
                answer = eventually(
                    lambda: victim.lookup(key),
                    until=lambda lookup: lookup.status_code != 202,
                    what="B's payment to leave processing",
                    timeout=120,
                    interval=0.2,
                )
            finally:
                stop.set()
            assert sum(flood.result() for flood in floods) > backlog
        assert answer.status_code == 200, answer.text
        assert answer.json()["status"] == "approved"
        (state,) = backend.sql("SELECT state FROM idempotency_key WHERE key = :key", key=key)[0]
        assert state == "completed"
    finally:
        server.stop()
