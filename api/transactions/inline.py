"""The one-write create: phases 1–3 of an inline token as ONE write to the database.

For a token the co-located issuer simulator answers at once (``answers_inline``), a create
is the issuer's record, the key row (inserted already ``completed`` with its stored
response), the transaction, its ledger entry and the outbox event — all or nothing. The
general path (``TransactionService._process_inline``) spends 8 round trips on that on
Postgres (read the key, BEGIN, five INSERTs, COMMIT) and 28 thread hops on SQLite. Here:

- Postgres (``pg_create.py``): one data-modifying-CTE statement, prepared, in autocommit —
  one statement is one transaction, ``synchronous_commit`` stays on;
- SQLite (``sqlite_create.py``): one writer thread with group commit — each create in its
  own SAVEPOINT, one ``synchronous=FULL`` COMMIT per batch, every answer given only after
  its batch's COMMIT returned.

The key insert decides (``ON CONFLICT DO NOTHING``): on a conflict nothing is written and
the same write hands back the existing key row, from which the general path answers (replay,
409, 410, 422). No read comes first: a fresh key and a replay each cost one write. A
request whose times need judging (clock skew, expiry, age) never comes here.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from api.idempotency.store import KeyRecord
from api.outbox import writer as outbox
from api.transactions import repository
from api.transactions.issuer import SimulatedIssuer
from api.transactions.schemas import TransactionCreate

if TYPE_CHECKING:
    from api.transactions.guard import DuplicateOf, Guard
    from api.transactions.service import TransactionService


class StorageUnavailableError(ConnectionError):
    """The database could not take the write now (connection lost, refused, disk full):
    answered 503, and nothing was acknowledged — a retry with the same key is safe."""


@dataclass(frozen=True, slots=True)
class InlineCreate:
    """Every row of one inline create, built before the write."""

    txn: repository.NewTransaction
    fingerprint: str
    response_body: str
    issuer_key: str
    ledger: dict[str, Any] | None  # approved only
    event: dict[str, Any]


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


class InlineWriter(Protocol):
    async def create(
        self, rows: InlineCreate, guard: Guard | None = None
    ) -> KeyRecord | bool | DuplicateOf:
        """True: written, durable. A ``KeyRecord``: nothing written, the key exists — this
        is its row. False: nothing written, nothing known (a duplicate that committed just
        now, or a write the general path must make): the caller reads the key and decides.
        With the merchant's duplicate guard (``guard``, api/transactions/guard.py) checked in
        the same write: ``DuplicateOf`` — nothing written, the key is new and the guard found
        the transaction it would duplicate (never when ``guard.allow``: then it is written,
        with ``duplicate_override`` set when a suspect was found)."""

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


def build(
    service: TransactionService,
    merchant_id: str,
    key: str,
    body: TransactionCreate,
    fingerprint: str,
    now: datetime,
) -> InlineCreate:
    issuer = service.issuer
    assert isinstance(issuer, SimulatedIssuer)  # only the co-located simulator can enlist
    issuer_key = service.issuer_key(merchant_id, key)
    auth = issuer.decide(issuer_key, body.card.token)
    txn = service.new_transaction(merchant_id, key, body, auth, created_at=now)
    ledger = None
    if txn.status == "approved":
        kind, signed = repository._ledger_amount(txn.type, txn.amount)
        ledger = {"entry_id": str(uuid.uuid4()), "amount": signed, "kind": kind}
    response_body = repository.render(txn)
    return InlineCreate(
        txn=txn,
        fingerprint=fingerprint,
        response_body=response_body,
        issuer_key=issuer_key,
        ledger=ledger,
        event=completed_event(merchant_id, key, response_body, txn.processed_at),
    )


def completed_event(
    merchant_id: str, key: str, response_body: str, now: datetime
) -> dict[str, Any]:
    """``outbox.new_event(event_type=COMPLETED, data=body_of(txn), …)``'s row, byte for byte,
    with the rendered response as ``data`` instead of the body encoded a second time (``data``
    is the payload's last member; tests/api/transactions/test_inline_writers.py holds the two
    equal)."""
    event_id = str(uuid.uuid4())
    head = repository.dumps(
        {
            "event_id": event_id,
            "type": outbox.COMPLETED,
            "merchant_id": merchant_id,
            "transaction_id": key,
            "occurred_at": repository.iso(now),
        }
    )
    return {
        "event_id": event_id,
        "merchant_id": merchant_id,
        "type": outbox.COMPLETED,
        "transaction_id": key,
        "payload": f'{head[:-1]},"data":{response_body}}}',
        "created_at": now,
    }
