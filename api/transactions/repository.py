"""Transaction and ledger rows, and the transaction body the API returns."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Row, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from api import deferred
from api.jsonfast import compact
from api.models import LedgerEntry, Transaction


@dataclass(frozen=True, slots=True)
class NewTransaction:
    merchant_id: str
    id: str
    terminal_id: str
    type: str
    amount: int
    currency: str
    card_last4: str
    card_brand: str
    card_fingerprint: str
    installments: int
    status: str
    decline_reason: str | None
    authorization_code: str | None
    captured_at: datetime | None
    created_at: datetime
    processed_at: datetime
    metadata_json: str | None
    offline: bool = False  # an offline advice (contract §2.2)
    duplicate_override: bool = False  # the guard found a suspect; the cashier confirmed
    rrn: str | None = None  # the retrieval reference at the acquirer (contract §2.9)


def iso(moment: datetime | None) -> str | None:
    if moment is None:
        return None
    return moment.isoformat().replace("+00:00", "Z")


def render(txn: NewTransaction | Any) -> str:
    """The transaction body of contract §2, serialized once (replays return these bytes)."""
    return compact(body_of(txn))


def body_of(txn: NewTransaction | Any, *, status: str | None = None) -> dict[str, Any]:
    return {
        "id": txn.id,
        "status": status or txn.status,
        "decline_reason": txn.decline_reason,
        "authorization_code": txn.authorization_code,
        "terminal_id": txn.terminal_id,
        "type": txn.type,
        "amount": txn.amount,
        "currency": txn.currency,
        "card": {"last4": txn.card_last4, "brand": txn.card_brand},
        "installments": txn.installments,
        "created_at": iso(txn.created_at),
        "processed_at": iso(txn.processed_at),
        "reversed_at": iso(getattr(txn, "reversed_at", None)),
        "offline": bool(txn.offline),
    }


def _ledger_amount(txn_type: str, amount: int) -> tuple[str, int]:
    return ("refund", -amount) if txn_type == "refund" else ("charge", amount)


_INSERT_TRANSACTION = insert(Transaction)
_INSERT_LEDGER = insert(LedgerEntry)
_FIELDS = tuple(NewTransaction.__slots__)
# The columns of the rows ``insert_transaction`` builds (the delegated finish on Citus names
# them): the transaction's, and its ledger entry's.
TRANSACTION_COLUMNS = tuple("metadata" if name == "metadata_json" else name for name in _FIELDS)
LEDGER_COLUMNS = (
    "entry_id",
    "merchant_id",
    "transaction_id",
    "amount",
    "currency",
    "kind",
    "created_at",
)


async def insert_transaction(conn: AsyncConnection, txn: NewTransaction) -> None:
    """The transaction row and, when approved, its one ledger entry (in a batch of
    finishes, sent with the batch's other rows: ``api.deferred``)."""
    values = {name: getattr(txn, name) for name in _FIELDS}
    values["metadata"] = values.pop("metadata_json")
    await deferred.insert(conn, _INSERT_TRANSACTION, values)
    if txn.status == "approved":
        kind, signed = _ledger_amount(txn.type, txn.amount)
        await deferred.insert(
            conn,
            _INSERT_LEDGER,
            {
                "entry_id": str(uuid.uuid4()),
                "merchant_id": txn.merchant_id,
                "transaction_id": txn.id,
                "amount": signed,
                "currency": txn.currency,
                "kind": kind,
                "created_at": txn.processed_at,
            },
        )


async def get(conn: AsyncConnection, merchant_id: str, txn_id: str) -> Row[Any] | None:
    table = Transaction.__table__
    return (
        await conn.execute(
            select(table).where(table.c.merchant_id == merchant_id, table.c.id == txn_id)
        )
    ).first()


async def reverse(conn: AsyncConnection, txn: Row[Any], *, now: datetime) -> bool:
    """Mark an approved transaction reversed and post the offsetting entry, exactly once."""
    result = await conn.execute(
        update(Transaction)
        .where(
            Transaction.merchant_id == txn.merchant_id,
            Transaction.id == txn.id,
            Transaction.status == "approved",
        )
        .values(status="reversed", reversed_at=now)
    )
    if not result.rowcount:
        return False
    _, signed = _ledger_amount(txn.type, txn.amount)
    await conn.execute(
        insert(LedgerEntry).values(
            entry_id=str(uuid.uuid4()),
            merchant_id=txn.merchant_id,
            transaction_id=txn.id,
            amount=-signed,
            currency=txn.currency,
            kind="reversal",
            created_at=now,
        )
    )
    return True
