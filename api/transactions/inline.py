"""The hot path's key reads: replay, lookup, abort and reversal read a key row (and its
transaction) without SQLAlchemy and without a write lock.

- Postgres (``pg_create.PgInline``): one prepared ``SELECT`` in autocommit on a connection of
  the hot path's own pool (``api.db.DriverPool``), no BEGIN/ROLLBACK;
- SQLite (``sqlite_create.SqliteInline``): a reader thread with a ``query_only`` autocommit
  connection (under WAL it sees the last commit and takes no lock), beside the writer
  thread whose batches carry the request events' flushes (``api.events.writer``).

Creates do not write here: every create is claim → one 0200 over the acquirer link →
finish (``api.transactions.service``, ``acquire``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from api.idempotency.store import KeyRecord


@dataclass(frozen=True, slots=True)
class StoredTransaction:
    """A transaction row as a lookup renders it (``repository.render``)."""

    id: str
    status: str
    decline_reason: str | None
    authorization_code: str | None
    terminal_id: str
    type: str
    amount: int
    currency: str
    card_last4: str
    card_brand: str
    installments: int
    created_at: datetime
    processed_at: datetime
    reversed_at: datetime | None
    offline: bool


TRANSACTION_COLUMNS = (
    "id, status, decline_reason, authorization_code, terminal_id, type, amount, currency,"
    " card_last4, card_brand, installments, created_at, processed_at, reversed_at, offline"
)
KEY_COLUMNS = (
    "merchant_id, key, state, fingerprint, lease_token, lease_until, request,"
    " response_status, response_body, terminal_id, created_at, deadline_at"
)


def _prefixed(columns: str, table: str) -> str:
    return ", ".join(f"{table}.{column.strip()}" for column in columns.split(","))


# The key row LEFT JOIN its transaction (the lookup's read): KEY_COLUMNS, then
# TRANSACTION_COLUMNS (all NULL when the key has no transaction). Placeholders per backend.
READ_KEY_AND_TRANSACTION = (
    f"SELECT {_prefixed(KEY_COLUMNS, 'k')}, {_prefixed(TRANSACTION_COLUMNS, 't')}"
    ' FROM idempotency_key AS k LEFT JOIN "transaction" AS t'
    " ON t.merchant_id = k.merchant_id AND t.id = k.key"
    " WHERE k.merchant_id = {merchant} AND k.key = {key}"
)
KEY_WIDTH = len(KEY_COLUMNS.split(","))


class HotReads(Protocol):
    """The hot path's reads (``TransactionService.inline``), and the storage they hold
    (connections, threads) closed after the last request."""

    async def read(self, merchant_id: str, key: str) -> KeyRecord | None:
        """The key row, read without taking any write lock."""

    async def read_transaction(self, merchant_id: str, key: str) -> StoredTransaction | None:
        """The transaction row as committed now (a lookup's body), likewise."""

    async def read_with_transaction(
        self, merchant_id: str, key: str
    ) -> tuple[KeyRecord | None, StoredTransaction | None]:
        """A lookup's two rows in one read (one round trip, one snapshot): the key row, and
        its transaction row when there is one (a completed key always has it)."""

    async def close(self) -> None:
        """Finish what was accepted, then release connections and threads."""
