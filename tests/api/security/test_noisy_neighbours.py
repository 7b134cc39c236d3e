"""One merchant cannot starve another's payments of the shared completer (issue 23, item 2;
docs/security.md, "Noisy neighbours")."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import httpx

from tests.support.backend import Backend
from tests.support.client import Api, body, card, new_key
from tests.support.eventually import eventually

FLOOD_CONNECTIONS = 60


def _offline(token: str, terminal: str) -> dict[str, object]:
    captured = (datetime.now(UTC) - timedelta(minutes=1)).isoformat()
    return body(terminal_id=terminal, card=card(token), entry_mode="offline", captured_at=captured)


def _flood(api: Api, stop: threading.Event) -> int:
    """Offline sales the acquirer never answers, back to back, until told to stop: each stays
    processing, its advice repeated by the completer for as long as it goes unanswered."""
    sent = 0
    with httpx.Client(base_url=api.base_url, timeout=30) as client:
        while not stop.is_set():
            client.post(
                "/v1/transactions",
                json=_offline("tok_issuer_down", "T-FLOOD"),
                headers=api.headers(new_key()),
            )
            sent += 1
    return sent


def test_a_flood_of_unanswered_payments_does_not_starve_another_merchant(
    private_pg_backend: Backend,
) -> None:
    """Merchant A floods offline ``tok_issuer_down`` sales: each one's repeated advice (0221)
    holds a completer slot for the acquirer timeout, for ever. Merchant B's offline
    ``tok_issuer_timeout`` sale (its 0220 unanswered: 202, then approved on the completer's
    first 0221) must still be approved — not left behind A's backlog. (An online key is no
    completer work: its owner settles it at the acquirer timeout.)"""
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
                created = victim.create(key, _offline("tok_issuer_timeout", "T-VICTIM"))
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
        assert answer.json()["offline"] is True
        (state,) = backend.sql("SELECT state FROM idempotency_key WHERE key = :key", key=key)[0]
        assert state == "completed"
    finally:
        server.stop()
