"""The transactional outbox: every completed, reversed or aborted transaction appends one
event in the same database transaction as the change (never a dual write).

Sequence numbers are per merchant, taken by an upsert on ``merchant_outbox_seq`` as the last
statement before commit. The row lock it takes is held until commit, so a merchant's
sequence follows commit order with no gaps (a rolled-back transaction rolls its number
back too). The relay publishes each merchant's events in ``seq`` order.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import insert
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from api.models import MerchantOutboxSeq, OutboxEvent
from api.transactions.repository import iso

COMPLETED = "transaction.completed"
REVERSED = "transaction.reversed"
ABORTED = "transaction.aborted"


async def _next_seq(conn: AsyncConnection, merchant_id: str) -> int:
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    statement = (
        dialect.insert(MerchantOutboxSeq)
        .values(merchant_id=merchant_id, seq=1)
        .on_conflict_do_update(
            index_elements=[MerchantOutboxSeq.merchant_id],
            set_={"seq": MerchantOutboxSeq.seq + 1},
        )
        .returning(MerchantOutboxSeq.seq)
    )
    return int((await conn.execute(statement)).scalar_one())


async def append(
    conn: AsyncConnection,
    *,
    merchant_id: str,
    event_type: str,
    transaction_id: str,
    data: dict[str, Any],
    now: datetime,
) -> None:
    seq = await _next_seq(conn, merchant_id)
    event_id = str(uuid.uuid4())
    payload = {
        "event_id": event_id,
        "type": event_type,
        "merchant_id": merchant_id,
        "seq": seq,
        "transaction_id": transaction_id,
        "occurred_at": iso(now),
        "data": data,
    }
    await conn.execute(
        insert(OutboxEvent).values(
            event_id=event_id,
            merchant_id=merchant_id,
            seq=seq,
            type=event_type,
            transaction_id=transaction_id,
            payload=json.dumps(payload, separators=(",", ":")),
            created_at=now,
        )
    )
