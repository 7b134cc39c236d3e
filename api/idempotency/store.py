"""The idempotency key store: claim, take over, complete, fence — each guarded by the key's
unique index or its lease token, so exactly one writer wins every race.

States: ``processing`` (owned by whoever holds ``lease_token`` until ``lease_until``) →
``completed`` (response stored) | ``aborted`` (fenced by abort or past the issuer deadline) |
``expired`` (fenced because the request arrived too late). Terminal states never change.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from sqlalchemy import ColumnElement, Row, bindparam, delete, select, text, update
from sqlalchemy.ext.asyncio import AsyncConnection

from api.db import insert_if_absent
from api.idempotency.waiters import SETTLED_KEYS
from api.models import IdempotencyKey


class KeyState(StrEnum):
    """A key's state (the ``state`` column; the values are in the database and the lake)."""

    PROCESSING = "processing"
    COMPLETED = "completed"
    ABORTED = "aborted"
    EXPIRED = "expired"


PROCESSING = KeyState.PROCESSING
COMPLETED = KeyState.COMPLETED
ABORTED = KeyState.ABORTED
EXPIRED = KeyState.EXPIRED


@dataclass(frozen=True, slots=True)
class KeyRecord:
    merchant_id: str
    key: str
    state: str
    fingerprint: str | None
    lease_token: int
    lease_until: datetime | None
    request: str | None
    response_status: int | None
    response_body: str | None
    terminal_id: str | None
    created_at: datetime
    deadline_at: datetime | None

    def lease_live(self, now: datetime) -> bool:
        return self.lease_until is not None and self.lease_until > now


_COLUMNS = (
    IdempotencyKey.merchant_id,
    IdempotencyKey.key,
    IdempotencyKey.state,
    IdempotencyKey.fingerprint,
    IdempotencyKey.lease_token,
    IdempotencyKey.lease_until,
    IdempotencyKey.request,
    IdempotencyKey.response_status,
    IdempotencyKey.response_body,
    IdempotencyKey.terminal_id,
    IdempotencyKey.created_at,
    IdempotencyKey.deadline_at,
)


def _record(row: Row[*tuple[Any, ...]]) -> KeyRecord:
    return KeyRecord(**row._asdict())


def _where(merchant_id: str, key: str) -> tuple[ColumnElement[bool], ColumnElement[bool]]:
    return (IdempotencyKey.merchant_id == merchant_id, IdempotencyKey.key == key)


_GET = select(*_COLUMNS).where(
    IdempotencyKey.merchant_id == bindparam("merchant_id"), IdempotencyKey.key == bindparam("key")
)


async def get(conn: AsyncConnection, merchant_id: str, key: str) -> KeyRecord | None:
    row = (await conn.execute(_GET, {"merchant_id": merchant_id, "key": key})).first()
    return _record(row) if row else None


async def claim(conn: AsyncConnection, row: dict[str, Any]) -> bool:
    """Insert a claim's row (``claim_row``: the key ``processing`` with lease token 1);
    False if the key exists."""
    return await insert_if_absent(conn, IdempotencyKey, row)


# The columns that tell one claim's row from any other's: the key, its claim time (unique
# within a process) and its lease end (with a random mark: across processes). A batch of
# claims sent as one statement learns which rows it inserted from these (``RETURNING``).
CLAIM_IDENTITY = ("merchant_id", "key", "created_at", "lease_until")
# The columns of the row ``claim_row`` builds (the delegated claim on Citus names them).
CLAIM_COLUMNS = (
    "merchant_id",
    "key",
    "state",
    "fingerprint",
    "lease_token",
    "lease_until",
    "request",
    "terminal_id",
    "created_at",
    "updated_at",
    "deadline_at",
)


def claim_row(
    *,
    merchant_id: str,
    key: str,
    fingerprint: str,
    request: str,
    terminal_id: str,
    now: datetime,
    lease_until: datetime,
    deadline_s: float,
) -> dict[str, Any]:
    """The row ``claim`` inserts."""
    return {
        "merchant_id": merchant_id,
        "key": key,
        "state": PROCESSING,
        "fingerprint": fingerprint,
        "lease_token": 1,
        "lease_until": lease_until,
        "request": request,
        "terminal_id": terminal_id,
        "created_at": now,
        "updated_at": now,
        "deadline_at": now + timedelta(seconds=deadline_s),
    }


async def insert_completed(
    conn: AsyncConnection,
    *,
    merchant_id: str,
    key: str,
    fingerprint: str,
    terminal_id: str,
    now: datetime,
    response_body: str,
) -> bool:
    """Insert the key already completed (the one-transaction path); False if it exists."""
    return await insert_if_absent(
        conn,
        IdempotencyKey,
        {
            "merchant_id": merchant_id,
            "key": key,
            "state": COMPLETED,
            "fingerprint": fingerprint,
            "lease_token": 1,
            "terminal_id": terminal_id,
            "response_status": 201,
            "response_body": response_body,
            "created_at": now,
            "updated_at": now,
        },
    )


async def fence(
    conn: AsyncConnection,
    *,
    merchant_id: str,
    key: str,
    state: str,
    now: datetime,
    fingerprint: str | None = None,
    terminal_id: str | None = None,
    response_status: int | None = None,
    response_body: str | None = None,
) -> bool:
    """Insert a tombstone (``aborted``/``expired``); False if the key already exists."""
    return await insert_if_absent(
        conn,
        IdempotencyKey,
        {
            "merchant_id": merchant_id,
            "key": key,
            "state": state,
            "fingerprint": fingerprint,
            "lease_token": 0,
            "terminal_id": terminal_id,
            "response_status": response_status,
            "response_body": response_body,
            "created_at": now,
            "updated_at": now,
        },
    )


async def take_over(
    conn: AsyncConnection, record: KeyRecord, *, now: datetime, lease_s: float
) -> int | None:
    """Claim an expired lease; the new token, or None if someone else got there first."""
    result = await conn.execute(
        update(IdempotencyKey)
        .where(
            *_where(record.merchant_id, record.key),
            IdempotencyKey.state == PROCESSING,
            IdempotencyKey.lease_token == record.lease_token,
        )
        .values(
            lease_token=record.lease_token + 1,
            lease_until=now + timedelta(seconds=lease_s),
            updated_at=now,
        )
    )
    return record.lease_token + 1 if result.rowcount else None


def settled(conn: AsyncConnection, merchant_id: str, key: str) -> None:
    """``key`` left ``processing`` in what ``conn`` runs: its waiters wake after the commit
    (a write made elsewhere than by this module: the delegated finish on Citus)."""
    _settled(conn, merchant_id, key, True)


def _settled(conn: AsyncConnection, merchant_id: str, key: str, won: bool) -> bool:
    """A key left ``processing`` (or was handed over): this process's ``Prefer: wait``
    waiters are woken once the transaction commits (``api.db.atomic``; Postgres also
    NOTIFYs every worker, migration 0007)."""
    if won:
        conn.info.setdefault(SETTLED_KEYS, []).append((merchant_id, key))
    return won


async def complete(
    conn: AsyncConnection,
    *,
    merchant_id: str,
    key: str,
    token: int,
    now: datetime,
    response_status: int,
    response_body: str,
) -> bool:
    """The final write: only the holder of the current lease token may complete the key."""
    result = await conn.execute(
        _COMPLETE,
        {
            "w_merchant": merchant_id,
            "w_key": key,
            "w_token": token,
            "v_status": response_status,
            "v_body": response_body,
            "v_now": now,
        },
    )
    return _settled(conn, merchant_id, key, bool(result.rowcount))


# Built once: every create's finish runs it, and building an UPDATE per call (its clauses,
# then its cache key) was a measured part of the finish's CPU.
_COMPLETE = (
    update(IdempotencyKey)
    .where(
        IdempotencyKey.merchant_id == bindparam("w_merchant"),
        IdempotencyKey.key == bindparam("w_key"),
        IdempotencyKey.state == PROCESSING,
        IdempotencyKey.lease_token == bindparam("w_token"),
    )
    .values(
        state=COMPLETED,
        response_status=bindparam("v_status"),
        response_body=bindparam("v_body"),
        request=None,
        lease_until=None,
        updated_at=bindparam("v_now", type_=IdempotencyKey.__table__.c.updated_at.type),
    )
)


# A batch of finishes on Postgres: one UPDATE for all its keys (``complete_together``), a
# statement prepared once whatever the batch's size. ``v.i`` names the finish that won each
# row: a row joins only the finish holding its current lease token.
_COMPLETE_TOGETHER = text(
    """
    UPDATE idempotency_key AS k
       SET state = 'completed', response_status = v.status, response_body = v.body,
           request = NULL, lease_until = NULL, updated_at = v.now
      FROM unnest(CAST(:merchants AS varchar[]), CAST(:keys AS varchar[]),
                  CAST(:tokens AS integer[]), CAST(:statuses AS integer[]),
                  CAST(:bodies AS text[]), CAST(:nows AS timestamptz[]))
           WITH ORDINALITY AS v(merchant_id, key, token, status, body, now, i)
     WHERE k.merchant_id = v.merchant_id AND k.key = v.key
       AND k.state = 'processing' AND k.lease_token = v.token
    RETURNING v.i
    """
)


@dataclass(frozen=True, slots=True)
class Completion:
    """One finish's final write (``complete``'s arguments)."""

    merchant_id: str
    key: str
    token: int
    now: datetime
    response_status: int
    response_body: str


async def complete_together(conn: AsyncConnection, items: list[Completion]) -> list[bool]:
    """``complete`` for many keys in one statement (Postgres only): per item, whether it
    completed its key (it held the current lease token)."""
    result = await conn.execute(
        _COMPLETE_TOGETHER,
        {
            "merchants": [item.merchant_id for item in items],
            "keys": [item.key for item in items],
            "tokens": [item.token for item in items],
            "statuses": [item.response_status for item in items],
            "bodies": [item.response_body for item in items],
            "nows": [item.now for item in items],
        },
    )
    won = {int(row[0]) - 1 for row in result}
    return [
        _settled(conn, item.merchant_id, item.key, index in won) for index, item in enumerate(items)
    ]


async def fence_owned(
    conn: AsyncConnection, *, merchant_id: str, key: str, token: int, now: datetime
) -> bool:
    """Turn a key we own (by lease token) into an ``aborted`` tombstone."""
    result = await conn.execute(
        update(IdempotencyKey)
        .where(
            *_where(merchant_id, key),
            IdempotencyKey.state == PROCESSING,
            IdempotencyKey.lease_token == token,
        )
        .values(state=ABORTED, request=None, lease_until=None, updated_at=now)
    )
    return _settled(conn, merchant_id, key, bool(result.rowcount))


async def release(
    conn: AsyncConnection, *, merchant_id: str, key: str, token: int, until: datetime
) -> None:
    """Hand a key we own to whoever comes next (the completer, a retry) at ``until``;
    waiting duplicates look again (one of them may be that retry)."""
    result = await conn.execute(
        update(IdempotencyKey)
        .where(
            *_where(merchant_id, key),
            IdempotencyKey.state == PROCESSING,
            IdempotencyKey.lease_token == token,
        )
        .values(lease_until=until)
    )
    _settled(conn, merchant_id, key, bool(result.rowcount))


async def forget(conn: AsyncConnection, *, merchant_id: str, key: str, token: int) -> bool:
    """Drop a claim we own whose authorization provably never left (contract §2.9: nothing
    was processed, the key is released); waiting duplicates look again."""
    result = await conn.execute(
        delete(IdempotencyKey).where(
            *_where(merchant_id, key),
            IdempotencyKey.state == PROCESSING,
            IdempotencyKey.lease_token == token,
        )
    )
    return _settled(conn, merchant_id, key, bool(result.rowcount))


async def expired_leases(conn: AsyncConnection, *, now: datetime, limit: int) -> list[KeyRecord]:
    rows = await conn.execute(
        select(*_COLUMNS)
        .where(IdempotencyKey.state == PROCESSING, IdempotencyKey.lease_until < now)
        .order_by(IdempotencyKey.lease_until)
        .limit(limit)
    )
    return [_record(row) for row in rows]
