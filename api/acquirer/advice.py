"""The reversal-advice queue: store and forward toward the acquirer (contract §2.9).

A row is written in the SAME transaction that settles its key — the key declined /
``acquirer_timeout`` for an in-doubt 0200 (``timeout``), a claim fenced while its 0200 may
have left (``abort``), an approved transaction reversed (``reversal``) — so a key is never
settled without the advice that undoes its authorization, and an advice never exists for a
key that was not settled. The advice worker (``api/acquirer/worker.py``) sends it as a 0420,
then 0421 with backoff, until a 0430 acknowledges it. One row per key: a key is settled once.

    queued (acknowledged_at NULL) ──0430──► acknowledged
        │  ▲
        └──┘ no answer / link down: attempts + 1, next_attempt_at = now + backoff
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from api.acquirer.types import ReversalRequest
from api.db import insert_if_absent
from api.models import AcquirerAdvice

TIMEOUT = "timeout"  # a 0200 in doubt: the key settled declined / acquirer_timeout
ABORT = "abort"  # a claim fenced (abort) while its 0200 may have left
REVERSAL = "reversal"  # an approved transaction reversed (POST /reversal)
BACKOFF_MAX_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class Advice:
    merchant_id: str
    key: str
    kind: str
    rrn: str
    terminal_id: str
    type: str
    amount: int
    currency: str
    original_stan: str
    original_transmitted_at: datetime | None
    created_at: datetime
    attempts: int
    next_attempt_at: datetime
    last_error: str | None
    acknowledged_at: datetime | None

    def request(self) -> ReversalRequest:
        return ReversalRequest(
            rrn=self.rrn,
            merchant_id=self.merchant_id,
            terminal_id=self.terminal_id,
            amount=self.amount,
            currency=self.currency,
            type=self.type,
            original_stan=self.original_stan,
            original_transmitted_at=self.original_transmitted_at,
            repeat=self.attempts > 0,
        )


_COLUMNS = tuple(getattr(AcquirerAdvice, name) for name in Advice.__dataclass_fields__)


async def queue(
    conn: AsyncConnection,
    *,
    kind: str,
    merchant_id: str,
    key: str,
    rrn: str,
    terminal_id: str,
    type: str,
    amount: int,
    currency: str,
    now: datetime,
    original_stan: str = "000000",
    original_transmitted_at: datetime | None = None,
) -> bool:
    """Queue the advice inside the caller's transaction; False when the key had one."""
    return await insert_if_absent(
        conn,
        AcquirerAdvice,
        {
            "merchant_id": merchant_id,
            "key": key,
            "kind": kind,
            "rrn": rrn,
            "terminal_id": terminal_id,
            "type": type,
            "amount": amount,
            "currency": currency,
            "original_stan": original_stan,
            "original_transmitted_at": original_transmitted_at,
            "created_at": now,
            "attempts": 0,
            "next_attempt_at": now,
            "last_error": None,
            "acknowledged_at": None,
        },
    )


async def get(conn: AsyncConnection, merchant_id: str, key: str) -> Advice | None:
    row = (
        await conn.execute(
            select(*_COLUMNS).where(
                AcquirerAdvice.merchant_id == merchant_id, AcquirerAdvice.key == key
            )
        )
    ).first()
    return Advice(**row._asdict()) if row is not None else None


async def due(conn: AsyncConnection, *, now: datetime, limit: int) -> list[Advice]:
    """Unacknowledged advices whose next attempt is due, oldest first."""
    rows = await conn.execute(
        select(*_COLUMNS)
        .where(AcquirerAdvice.acknowledged_at.is_(None), AcquirerAdvice.next_attempt_at <= now)
        .order_by(AcquirerAdvice.next_attempt_at)
        .limit(limit)
    )
    return [Advice(**row._asdict()) for row in rows]


async def take(conn: AsyncConnection, advice: Advice, *, until: datetime) -> bool:
    """Own one attempt (a compare-and-set on ``next_attempt_at``): of the workers that read
    the same due row, exactly one sends it now."""
    result = await conn.execute(
        update(AcquirerAdvice)
        .where(
            AcquirerAdvice.merchant_id == advice.merchant_id,
            AcquirerAdvice.key == advice.key,
            AcquirerAdvice.acknowledged_at.is_(None),
            AcquirerAdvice.next_attempt_at == advice.next_attempt_at,
        )
        .values(next_attempt_at=until)
    )
    return bool(result.rowcount)


async def acknowledge(conn: AsyncConnection, advice: Advice, *, now: datetime) -> None:
    await conn.execute(
        update(AcquirerAdvice)
        .where(AcquirerAdvice.merchant_id == advice.merchant_id, AcquirerAdvice.key == advice.key)
        .values(acknowledged_at=now, attempts=advice.attempts + 1, last_error=None)
    )


def backoff(attempts: int) -> float:
    """Seconds before attempt ``attempts + 1``: 1, 2, 4, … capped at a minute."""
    return float(min(BACKOFF_MAX_SECONDS, 2.0 ** min(attempts, 16)))


async def retry_later(conn: AsyncConnection, advice: Advice, *, now: datetime, error: str) -> None:
    await conn.execute(
        update(AcquirerAdvice)
        .where(
            AcquirerAdvice.merchant_id == advice.merchant_id,
            AcquirerAdvice.key == advice.key,
            AcquirerAdvice.acknowledged_at.is_(None),
        )
        .values(
            attempts=advice.attempts + 1,
            next_attempt_at=now + timedelta(seconds=backoff(advice.attempts)),
            last_error=error[:200],
        )
    )


async def depth(conn: AsyncConnection, *, now: datetime) -> tuple[int, float]:
    """(advices not yet acknowledged, age of the oldest in seconds)."""
    row = (
        await conn.execute(
            select(func.count(), func.min(AcquirerAdvice.created_at)).where(
                AcquirerAdvice.acknowledged_at.is_(None)
            )
        )
    ).one()
    count, oldest = int(row[0]), row[1]
    if oldest is not None and oldest.tzinfo is None:
        from datetime import UTC

        oldest = oldest.replace(tzinfo=UTC)
    return count, (now - oldest).total_seconds() if oldest is not None else 0.0


async def listing(conn: AsyncConnection, *, pending_only: bool, limit: int) -> list[Advice]:
    """For ``idempay admin acquirer-queue``: oldest first."""
    query = select(*_COLUMNS).order_by(AcquirerAdvice.created_at).limit(limit)
    if pending_only:
        query = query.where(AcquirerAdvice.acknowledged_at.is_(None))
    return [Advice(**row._asdict()) for row in await conn.execute(query)]
