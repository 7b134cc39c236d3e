"""What the server's Postgres database holds for one merchant, read with plain SQL.

The integration tests check contract §8 with these queries, independently of
``idempay_tools.invariants`` (which they also run): the code under test never grades itself alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from api.auth import hash_key
from client_sdk import Client, Journal, JournalEntry
from tests.support.backend import Backend
from tests.support.eventually import eventually

_T = TypeVar("_T")


@dataclass(frozen=True)
class Merchant:
    backend: Backend
    id: str
    api_key: str

    @classmethod
    def create(cls, backend: Backend, name: str) -> Merchant:
        api_key = backend.api_key(name)
        [(merchant_id,)] = backend.sql(
            "SELECT merchant_id FROM api_key WHERE key_hash = :h", h=hash_key(api_key)
        )
        return cls(backend, merchant_id, api_key)

    def transactions(self) -> dict[str, str]:
        """transaction id (= idempotency key) → status."""
        rows = self.backend.sql(
            'SELECT id, status FROM "transaction" WHERE merchant_id = :m', m=self.id
        )
        return {row[0]: row[1] for row in rows}

    def charges(self) -> dict[str, int]:
        """transaction id → number of ``charge`` ledger entries."""
        rows = self.backend.sql(
            "SELECT transaction_id, count(*) FROM ledger_entry "
            "WHERE merchant_id = :m AND kind = 'charge' GROUP BY transaction_id",
            m=self.id,
        )
        return {row[0]: int(row[1]) for row in rows}

    def key_states(self) -> dict[str, str]:
        rows = self.backend.sql(
            "SELECT key, state FROM idempotency_key WHERE merchant_id = :m", m=self.id
        )
        return {row[0]: row[1] for row in rows}

    def aborted_with_transaction(self) -> list[str]:
        rows = self.backend.sql(
            'SELECT k.key FROM idempotency_key k JOIN "transaction" t '
            "ON t.merchant_id = k.merchant_id AND t.id = k.key "
            "WHERE k.merchant_id = :m AND k.state = 'aborted'",
            m=self.id,
        )
        return [row[0] for row in rows]

    def create_events(self, key: str) -> list[tuple[str, int, int | None]]:
        """(outcome, http_status, attempt) of every create the server saw for ``key``."""
        rows = self.backend.sql(
            "SELECT outcome, http_status, attempt FROM request_event "
            "WHERE merchant_id = :m AND idempotency_key = :k AND endpoint = 'create' "
            "ORDER BY ts",
            m=self.id,
            k=key,
        )
        return [(row[0], int(row[1]), row[2]) for row in rows]

    def create_events_of_a_retry(self, key: str) -> list[tuple[str, int]]:
        """(outcome, http_status) of ``key``'s creates once the server saw two or more (a
        refused one and its resend), within 10 s."""
        return wait_for(
            lambda: (
                [e[:2] for e in self.create_events(key)][1:]
                and [e[:2] for e in self.create_events(key)]
            ),
            timeout=10,
            what="both create events",
        )

    def client(self, url: str, terminal_id: str, journal: Path, **options: Any) -> Client:
        """The SDK's client of this merchant on ``url``: ``options`` as ``Client`` takes them."""
        return Client(url, self.api_key, terminal_id=terminal_id, journal=journal, **options)


def journal_entries(path: Path) -> list[JournalEntry]:
    with Journal(path) as journal:
        return journal.entries()


def wait_for(probe: Callable[[], _T | None], *, timeout: float, what: str) -> _T:
    """Poll ``probe`` (every 50 ms at most) until it returns something truthy (bounded)."""
    found = eventually(probe, what=what, timeout=timeout, interval=0.05)
    assert found  # eventually returns only a truthy value
    return found
