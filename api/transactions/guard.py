"""The duplicate guard at the counter (issue 17, part 3; contract §2.2).

Per merchant, opt-in (``idempay admin guard MERCHANT --window SECONDS``; off by default): a
create of a NEW key for a purchase — not an offline advice, not a refund — is refused with
409 ``suspected_duplicate`` when an earlier approved purchase of the same merchant, terminal,
card (``card_fingerprint``), amount and currency was created within the window (inclusive,
either side of this one's ``created_at``) under another key — unless the body says
``"allow_duplicate": true`` (the cashier confirmed the sale): then it is processed and its
transaction carries ``duplicate_override = true``. Nothing is stored under a refused key and
the acquirer is never asked.

The check is one range probe of ``ix_transaction_duplicate_guard`` inside the transaction
that claims the key (``find_suspect``, after ``pg_advisory_xact_lock`` on Postgres), so it
costs no extra round trip and a refused key leaves nothing behind.

Races: two new keys for the same sale racing each other serialize on the advisory lock of
(merchant, terminal, card, amount, currency) on Postgres — taken only when the guard is on,
released at the claim's commit — and on SQLite's single writer. A sale is itself invisible
to the guard until its transaction is written (after the acquirer's answer): another sale of
the same card claimed while the first is still at the acquirer is not blocked by it. The
next day's audit still reports the pair as a suspected double charge.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select, text, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from api.db import atomic
from api.errors import SuspectedDuplicateError
from api.events.writer import RequestOutcome
from api.models import Merchant, Transaction
from api.transactions.merchants import merchant_of
from api.transactions.outcome import IdempotencyStatus, Outcome, from_error

# The first key of pg_advisory_xact_lock(int4, int4) for the guard (the two-key space is not
# the one of the migration and relay locks); migration 0010's function uses the same value.
LOCK_CLASS = 0x1DE4_0D0
DEFAULT_WINDOW_S = 120  # contract §5: suspected_double_charges pairs ≤ 120 s apart
MAX_WINDOW_S = 86_400


@dataclass(frozen=True, slots=True)
class Guard:
    """The guard's check for one create: what to look for and whether the cashier allowed it."""

    window_s: int
    allow: bool  # "allow_duplicate": true — process even when a suspect is found
    card_fingerprint: str
    lock: int  # the second key of the advisory lock (int4)

    def bounds(self, created_at: datetime) -> tuple[datetime, datetime]:
        """The window around this create's ``created_at``, both ends inclusive."""
        window = timedelta(seconds=self.window_s)
        return created_at - window, created_at + window


@dataclass(frozen=True, slots=True)
class DuplicateOf:
    """An inline writer's answer when the guard refused the create: nothing was written."""

    id: str


def lock_key(
    merchant_id: str, terminal_id: str, card_fingerprint: str, amount: int, currency: str
) -> int:
    """A signed 32-bit hash of what makes two sales duplicates of each other."""
    text_ = f"{merchant_id}\0{terminal_id}\0{card_fingerprint}\0{amount}\0{currency}"
    return int.from_bytes(hashlib.sha256(text_.encode()).digest()[:4], "big", signed=True)


async def find_suspect(
    conn: AsyncConnection,
    guard: Guard,
    *,
    merchant_id: str,
    key: str,
    terminal_id: str,
    amount: int,
    currency: str,
    created_at: datetime,
) -> str | None:
    """The id of the latest approved purchase this create would duplicate, or None. On
    Postgres (and Citus: the lock is the coordinator's) the guard's lock is taken first, in
    ``conn``'s transaction, so a racing create of the same sale is committed and seen, or
    waits for us."""
    if conn.dialect.name == "postgresql":
        await conn.execute(
            text("SELECT pg_advisory_xact_lock(:cls, :lock)"),
            {"cls": LOCK_CLASS, "lock": guard.lock},
        )
    since, until = guard.bounds(created_at)
    found = await conn.execute(
        select(Transaction.id)
        .where(
            Transaction.merchant_id == merchant_id,
            Transaction.terminal_id == terminal_id,
            Transaction.card_fingerprint == guard.card_fingerprint,
            Transaction.amount == amount,
            Transaction.created_at >= since,
            Transaction.created_at <= until,
            Transaction.currency == currency,
            Transaction.type == "purchase",
            Transaction.status == "approved",
            Transaction.id != key,
        )
        .order_by(Transaction.created_at.desc(), Transaction.id)
        .limit(1)
    )
    suspect = found.scalar_one_or_none()
    return None if suspect is None else str(suspect)


def blocked(duplicate_of: str, terminal_id: str) -> Outcome:
    """409 ``suspected_duplicate``: recorded as a create ``rejected`` with 409 (the audit's
    count of blocked duplicates), ``Idempotency-Status: not_found`` — nothing was stored
    under the key, as for every create refused before it was stored (422 ``clock_skew``,
    ``validation_error``): resending it with ``"allow_duplicate": true`` processes it."""
    error = SuspectedDuplicateError(
        f"An approved purchase of the same card, amount and terminal was made moments ago "
        f"({duplicate_of}); nothing was stored or charged. Resend the same request with the "
        'same key and "allow_duplicate": true if the customer confirms a second payment (the '
        "idempay SDK fences this key and sends the confirmed payment under a new one: "
        "contract §4.13).",
        extra={"duplicate_of": duplicate_of},
    )
    return from_error(
        error,
        event=RequestOutcome.REJECTED,
        idempotency_status=IdempotencyStatus.NOT_FOUND,
        terminal_id=terminal_id,
    )


# ------------------------------------------------------------------ the admin command


@dataclass(frozen=True, slots=True)
class GuardSetting:
    merchant_id: str
    merchant_name: str
    window_s: int | None  # None: off


async def setting(engine: AsyncEngine, merchant: str) -> GuardSetting:
    """The guard of the merchant ``merchant`` (its id, or else its name: ``merchant_of``)."""
    merchant_id, name = await merchant_of(engine, merchant)
    async with engine.connect() as conn:
        window = await conn.scalar(
            select(Merchant.duplicate_guard_s).where(Merchant.id == merchant_id)
        )
    return GuardSetting(merchant_id, name, window)


async def set_window(engine: AsyncEngine, merchant: str, window_s: int | None) -> GuardSetting:
    """Turn the merchant's guard on with ``window_s`` seconds, or off (None)."""
    if window_s is not None and not 1 <= window_s <= MAX_WINDOW_S:
        raise ValueError(f"the window is 1 to {MAX_WINDOW_S} seconds")
    current = await setting(engine, merchant)
    async with atomic(engine) as conn:
        await conn.execute(
            update(Merchant)
            .where(Merchant.id == current.merchant_id)
            .values(duplicate_guard_s=window_s)
        )
    return GuardSetting(current.merchant_id, current.merchant_name, window_s)


def describe(guard: GuardSetting) -> str:
    state = "off" if guard.window_s is None else f"on, window {guard.window_s} s"
    return f"{guard.merchant_name} ({guard.merchant_id}): duplicate guard {state}"
