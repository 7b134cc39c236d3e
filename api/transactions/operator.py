"""Support's tools for one key — ``idempay admin key show|fence|reverse`` — so nobody needs SQL.

``show`` reads the key, its lease, its transaction, its ledger entries, the request events
recorded for it and its outbox events. ``fence`` and ``reverse`` are the terminal's abort and
reversal, run through the very functions the HTTP routes call (``resolution.abort`` and
``resolution.reverse``) on the service the caller built as the server builds it (the CLI,
with ``api.main.build_context``): the same
guarded transitions, so a key is fenced only if nothing was processed under it (a request
that may still answer its terminal is "in progress": nothing changes), a transaction is
reversed exactly once, and Redis learns of both. The operator's reason is written into the
outbox event that the change commits with (``data.reason``); a call that changes nothing
records nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from api.db import utcnow
from api.events.writer import RequestOutcome
from api.idempotency import store
from api.idempotency.store import KeyRecord
from api.models import LedgerEntry, OutboxEvent, RequestEvent
from api.transactions import repository, resolution
from api.transactions.merchants import merchant_of
from api.transactions.outcome import Outcome
from api.transactions.service import TransactionService

Action = Literal["fence", "reverse"]


@dataclass(frozen=True, slots=True)
class KeyReport:
    merchant_id: str
    merchant_name: str
    key: str
    record: KeyRecord | None
    transaction: dict[str, Any] | None
    ledger: list[Any]
    requests: list[Any]
    outbox: list[Any]


async def report(engine: AsyncEngine, merchant: str, key: str) -> KeyReport:
    merchant_id, name = await merchant_of(engine, merchant)
    async with engine.connect() as conn:
        record = await store.get(conn, merchant_id, key)
        txn = await repository.get(conn, merchant_id, key)
        ledger = await conn.execute(
            select(
                LedgerEntry.kind, LedgerEntry.amount, LedgerEntry.currency, LedgerEntry.created_at
            )
            .where(LedgerEntry.merchant_id == merchant_id, LedgerEntry.transaction_id == key)
            .order_by(LedgerEntry.created_at)
        )
        requests = await conn.execute(
            select(RequestEvent)
            .where(RequestEvent.merchant_id == merchant_id, RequestEvent.idempotency_key == key)
            .order_by(RequestEvent.ts)
        )
        outbox = await conn.execute(
            select(OutboxEvent.created_at, OutboxEvent.type, OutboxEvent.seq, OutboxEvent.payload)
            .where(OutboxEvent.merchant_id == merchant_id, OutboxEvent.transaction_id == key)
            .order_by(OutboxEvent.id)
        )
        return KeyReport(
            merchant_id=merchant_id,
            merchant_name=name,
            key=key,
            record=record,
            transaction=repository.body_of(txn) if txn is not None else None,
            ledger=list(ledger.all()),
            requests=list(requests.all()),
            outbox=list(outbox.all()),
        )


def _lease(record: KeyRecord, now: datetime) -> str:
    if record.lease_until is None:
        return f"token {record.lease_token}, released"
    live = "live" if record.lease_live(now) else "expired"
    return f"token {record.lease_token}, until {repository.iso(record.lease_until)} ({live})"


def _attempts(report: KeyReport) -> str:
    creates = [row for row in report.requests if row.endpoint == "create"]
    numbers = [row.attempt for row in creates if row.attempt is not None]
    highest = f", highest Idempotency-Attempt {max(numbers)}" if numbers else ""
    owners = report.record.lease_token if report.record else 0
    return f"{len(creates)} create request(s) recorded{highest}; {owners} lease owner(s)"


def describe(report: KeyReport, *, now: datetime | None = None) -> list[str]:
    """The lines ``idempay admin key show`` prints."""
    record = report.record
    lines = [f"merchant: {report.merchant_name} ({report.merchant_id})", f"key: {report.key}"]
    if record is None:
        lines.append("state: unknown (nothing was processed under this key)")
    else:
        lines += [
            f"state: {record.state}",
            f"terminal: {record.terminal_id or '-'}",
            f"created: {repository.iso(record.created_at)}",
            f"issuer deadline: {repository.iso(record.deadline_at) or '-'}",
            f"lease: {_lease(record, now or utcnow())}",
        ]
    lines.append(f"attempts: {_attempts(report)}")
    txn = json.dumps(report.transaction, separators=(",", ":")) if report.transaction else "-"
    lines.append(f"transaction: {txn}")
    lines.append(f"ledger entries: {len(report.ledger)}")
    for entry in report.ledger:
        at = repository.iso(entry.created_at)
        lines.append(f"  {entry.kind} {entry.amount} {entry.currency} at {at}")
    lines.append(f"request events: {len(report.requests)}")
    for row in report.requests:
        attempt = f" attempt={row.attempt}" if row.attempt is not None else ""
        lines.append(
            f"  {repository.iso(row.ts)} {row.endpoint} {row.outcome} {row.http_status}{attempt}"
        )
    lines.append(f"outbox events: {len(report.outbox)}")
    for row in report.outbox:
        reason = json.loads(row.payload)["data"].get("reason")
        why = f" reason={reason!r}" if reason else ""
        seq = row.seq if row.seq is not None else "-"
        lines.append(f"  {repository.iso(row.created_at)} {row.type} seq={seq}{why}")
    return lines


async def act(
    service: TransactionService, merchant: str, key: str, *, action: Action, reason: str
) -> Outcome:
    """Fence or reverse ``key`` of ``merchant`` as the HTTP route would, with ``reason``, on
    ``service`` (the server's, built by the caller)."""
    merchant_id, _ = await merchant_of(service.engine, merchant)
    run = resolution.abort if action == "fence" else resolution.reverse
    return await run(service, merchant_id, key, reason=reason)


def verdict(action: Action, outcome: Outcome) -> tuple[str, bool]:
    """What to print after ``act``, and whether the key is now as the operator asked."""
    body = json.loads(outcome.body) if outcome.body else {}
    if outcome.problem:
        return f"refused: {outcome.status} {body.get('code')}: {body.get('detail')}", False
    status = body.get("status")
    if action == "fence":
        if status in ("aborted", "expired"):
            return f"fenced: the key is {status}; it will never be processed", True
        return f"not fenced: the key was processed ({status}): {outcome.body.decode()}", False
    done = "reversed now" if outcome.event == RequestOutcome.REVERSED else "already reversed"
    return f"{done}: {outcome.body.decode()}", True
