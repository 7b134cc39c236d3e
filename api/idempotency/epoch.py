"""The database's epoch (contract §3.6): what every Redis entry is bound to.

A restored or replaced database must never be contradicted by answers Redis remembers from
the database it replaced. The epoch is a UUID in the database itself (table
``database_epoch``, one row): written by the migration that creates it and kept by every
later ``idempay migrate``, renewed by ``idempay admin new-epoch`` after a restore. Cache
keys carry it, so an entry written before the restore is never read after it.
"""

from __future__ import annotations

import uuid

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from api.db import atomic, insert_if_absent, utcnow
from api.models import DatabaseEpoch

EPOCH_ROW = 1


async def read_epoch(conn: AsyncConnection) -> str | None:
    row = (
        await conn.execute(select(DatabaseEpoch.epoch).where(DatabaseEpoch.id == EPOCH_ROW))
    ).first()
    return str(row[0]) if row else None


async def ensure_epoch(engine: AsyncEngine) -> str:
    """The current epoch, written first if the row is missing (``idempay migrate``)."""
    async with atomic(engine) as conn:
        values = {"id": EPOCH_ROW, "epoch": str(uuid.uuid4()), "created_at": utcnow()}
        await insert_if_absent(conn, DatabaseEpoch, values)
        epoch = await read_epoch(conn)
    assert epoch is not None
    return epoch


async def renew_epoch(engine: AsyncEngine) -> tuple[str | None, str]:
    """A new epoch (after a restore): (the previous one, the new one)."""
    async with atomic(engine) as conn:
        return await renew_epoch_in(conn)


async def renew_epoch_in(conn: AsyncConnection) -> tuple[str | None, str]:
    """``renew_epoch`` inside the caller's transaction: it takes effect with its commit (a
    reversal whose mark could not reach Redis, ``api.transactions.resolution.reverse``)."""
    new = str(uuid.uuid4())
    old = await read_epoch(conn)
    changed = await conn.execute(
        update(DatabaseEpoch)
        .where(DatabaseEpoch.id == EPOCH_ROW)
        .values(epoch=new, created_at=utcnow())
    )
    if not changed.rowcount:
        values = {"id": EPOCH_ROW, "epoch": new, "created_at": utcnow()}
        await insert_if_absent(conn, DatabaseEpoch, values)
    return old, new
