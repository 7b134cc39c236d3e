"""Rows written straight into a test's own database, for the export's edge cases."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from sqlalchemy import insert
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from api.models import LedgerEntry, RequestEvent, Transaction
from tests.support.backend import Backend

MERCHANT = "mer_export"


def moment(day: date, second: int) -> datetime:
    return datetime.combine(day, time(10), tzinfo=UTC) + timedelta(seconds=second)


def event(day: date, second: int, key: str | None = None) -> dict[str, Any]:
    return {
        "event_id": str(uuid.uuid4()),
        "ts": moment(day, second),
        "merchant_id": MERCHANT,
        "terminal_id": "T-1",
        "idempotency_key": key or str(uuid.uuid4()),
        "endpoint": "create",
        "outcome": "created",
        "http_status": 201,
        "attempt": 1,
        "network": "gprs",
        "latency_ms": 3.0,
    }


def transaction(day: date, second: int, key: str) -> dict[str, Any]:
    at = moment(day, second)
    return {
        "merchant_id": MERCHANT,
        "id": key,
        "terminal_id": "T-1",
        "type": "purchase",
        "amount": 1250,
        "currency": "BRL",
        "card_last4": "4242",
        "card_brand": "visa",
        "card_fingerprint": "fp",
        "installments": 1,
        "status": "approved",
        "created_at": at,
        "processed_at": at,
    }


def charge(day: date, second: int, key: str) -> dict[str, Any]:
    return {
        "entry_id": str(uuid.uuid4()),
        "merchant_id": MERCHANT,
        "transaction_id": key,
        "amount": 1250,
        "currency": "BRL",
        "kind": "charge",
        "created_at": moment(day, second),
    }


def payments(day: date, first: int, count: int) -> dict[str, list[dict[str, Any]]]:
    """``count`` approved payments: each a create event, its transaction and its charge."""
    keys = [str(uuid.uuid4()) for _ in range(count)]
    seconds = range(first, first + count)
    return {
        "request_events": [event(day, s, k) for s, k in zip(seconds, keys, strict=True)],
        "transactions": [transaction(day, s, k) for s, k in zip(seconds, keys, strict=True)],
        "ledger_entries": [charge(day, s, k) for s, k in zip(seconds, keys, strict=True)],
    }


MODELS = {
    "request_events": RequestEvent,
    "transactions": Transaction,
    "ledger_entries": LedgerEntry,
}


def insert_rows(backend: Backend, rows: dict[str, list[dict[str, Any]]]) -> None:
    async def run() -> None:
        engine = create_async_engine(backend.url, poolclass=NullPool)
        try:
            async with engine.begin() as conn:
                for table in ("transactions", "ledger_entries", "request_events"):
                    if rows.get(table):
                        await conn.execute(insert(MODELS[table]), rows[table])
        finally:
            await engine.dispose()

    asyncio.run(run())
