"""A merchant named on an admin command (``idempay admin key …``, ``idempay admin guard``):
by its id or, else, by its name."""

from __future__ import annotations

from sqlalchemy import or_, select
from sqlalchemy.ext.asyncio import AsyncEngine

from api.models import Merchant


class UnknownMerchantError(LookupError):
    """No merchant has this name or id."""


async def merchant_of(engine: AsyncEngine, merchant: str) -> tuple[str, str]:
    """(id, name) of the merchant whose id it is or, else, named ``merchant``: an id match
    wins, so a merchant whose *name* is another's id never makes the answer depend on the
    row order (the admin commands: key tools, guard)."""
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                select(Merchant.id, Merchant.name)
                .where(or_(Merchant.name == merchant, Merchant.id == merchant))
                .order_by((Merchant.id == merchant).desc())
            )
        ).first()
    if row is None:
        raise UnknownMerchantError(f"no merchant named {merchant!r}")
    return str(row.id), str(row.name)
