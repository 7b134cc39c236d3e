"""``Prefer: wait`` on Citus across server processes (docs/contract.md §2.8, docs/scaling.md).

The key's settlement NOTIFY comes from a trigger on the key rows, which on Citus live on the
workers: their NOTIFY cannot reach the API's LISTEN on the coordinator. So on Citus, as on
SQLite, a waiter looks again once a second: a request waiting in one server process is
released within about a second of another process settling the key — not held to its limit
(before: held the full wait, 202 after 20 s, with the key approved ~2 s after the create)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from tests.support.backend import Backend
from tests.support.client import Api, new_key, slow_create_in_flight

SLOW_S = 2.0  # the acquirer's answer to tok_issuer_slow
WAIT_S = 12  # well past the settle (~2 s): a waiter held to here was never released


def test_a_request_waiting_in_another_process_is_released_soon_after_the_settle(
    citus_db: Backend,
) -> None:
    # ACQUIRER_TIMEOUT well above SLOW_S: the key settles approved by the acquirer's answer on
    # a loaded machine too, never declined in doubt (the suite's 3 s leaves 1 s of margin)
    settling = citus_db.server(
        IDEMPAY_ACQUIRER_SLOW_SECONDS=str(SLOW_S),
        IDEMPAY_ACQUIRER_TIMEOUT="10",
        IDEMPAY_DB_TIMEOUT="60",
    )
    waiting = citus_db.server(IDEMPAY_DB_TIMEOUT="60")
    try:
        api_key = citus_db.api_key("citus-wait")
        here, there = Api(settling.url, api_key), Api(waiting.url, api_key)
        key = new_key()
        original, created = slow_create_in_flight(here, key, seen_by=there)
        started = time.monotonic()
        with there.client() as client:
            answer = client.get(
                f"/v1/transactions/{key}",
                headers=there.headers(None, Prefer=f"wait={WAIT_S}"),
                timeout=WAIT_S + 10,
            )
        held = time.monotonic() - started
        answered_at = datetime.now(UTC)
        original.join(30)
        settled = there.lookup(key)

        # the key settled in the settling process, approved by the acquirer: 201, or 202 when
        # its answer came after IDEMPAY_ANSWER_WITHIN (1.5 s) and that server finished it
        assert created and created[0].status_code in (201, 202), created
        assert settled.status_code == 200, settled.text
        assert settled.json()["status"] == "approved", settled.text
        processed_at = datetime.fromisoformat(settled.json()["processed_at"])

        # the waiter in the other process saw it by its once-a-second look: released soon
        # after the settle, with the transaction, long before its limit
        assert answer.status_code == 200, (answer.text, held, dict(answer.headers))
        assert answer.json()["status"] == "approved", answer.text
        assert answer.headers["preference-applied"] == f"wait={WAIT_S}"
        assert answered_at - processed_at < timedelta(seconds=5), (processed_at, answered_at)
        assert held < WAIT_S - 2, held
    finally:
        waiting.stop()
        settling.stop()
