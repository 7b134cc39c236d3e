"""contract §8: the invariants every fleet, load and chaos run is checked against.

``check_invariants(engine, merchant_ids=..., reported=..., journals=...)`` reads the
database (SQLAlchemy Core on an ``AsyncEngine``; Postgres or the embedded SQLite) and the
terminals' journals, and returns an ``InvariantReport``:

| invariant                  | violated by                                                   |
|----------------------------|---------------------------------------------------------------|
| ``reported_exactly_once``  | a payment the SDK reported approved/declined/reversed with no |
|                            | transaction (lost), more than one (duplicate), or another     |
|                            | status; a payment reported aborted, or a stored one the       |
|                            | server refused (REPORTED), that has a transaction             |
| ``one_charge_per_key``     | a (merchant, transaction) with two ``charge`` ledger entries  |
| ``charge_has_transaction`` | a ``charge`` ledger entry whose transaction does not exist    |
| ``aborted_not_processed``  | an ``aborted`` idempotency key that has a transaction         |
| ``journal_definitive``     | a journal entry not RESOLVED, ABORTED or REPORTED (one left   |
|                            | STORED, sold offline and never forwarded, included), or a     |
|                            | payment reported ``in_doubt`` that no journal settled         |
| ``ledger_balanced``        | per merchant and currency, Σ ledger ≠ approved purchases −    |
|                            | approved refunds − reversals (signed)                         |
| ``one_charge_per_sale``    | a sale (``metadata.sale_id`` in the journals) with more than  |
|                            | one approved transaction: a customer charged twice           |

Everything is scoped to ``merchant_ids`` so a run can be checked on a shared database.
``restored_away``: keys reported while a database restore took back what they committed
(between the dump and the restore); the database may lack them, and must not hold them
twice.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import and_, case, func, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from api.auth import hash_key
from api.models import ApiKey, IdempotencyKey, LedgerEntry, Transaction
from client_sdk import Journal, JournalEntry, JournalState

__all__ = [
    "INVARIANTS",
    "InvariantReport",
    "LedgerBalance",
    "Violation",
    "check_invariants",
    "merchant_for_api_key",
    "reported_from_journals",
]

INVARIANTS = (
    "reported_exactly_once",
    "one_charge_per_key",
    "charge_has_transaction",
    "aborted_not_processed",
    "journal_definitive",
    "ledger_balanced",
    "one_charge_per_sale",
)
PROCESSED = frozenset({"approved", "declined", "reversed"})
NEVER = frozenset({"aborted", "refused"})  # claims of a payment that was never processed
NOT_DEFINITIVE = frozenset({"open", "in_doubt"})
_CHUNK = 500
_MAX_VIOLATIONS = 50


@dataclass(frozen=True, slots=True)
class Violation:
    invariant: str
    key: str | None
    detail: str


@dataclass(frozen=True, slots=True)
class LedgerBalance:
    merchant_id: str
    currency: str
    ledger: int
    expected: int

    @property
    def ok(self) -> bool:
        return self.ledger == self.expected


@dataclass(frozen=True, slots=True)
class InvariantReport:
    """What the database and the journals say about one run; ``ok`` when nothing failed.

    ``duplicates``: keys charged or stored more than once; ``lost``: payments reported
    processed that the server does not hold with that status; ``journal_open``: payments
    not definitive at the end (all three must be 0). ``processing_keys`` is informational:
    keys the server is still working on."""

    merchant_ids: tuple[str, ...]
    reported: int
    transactions: int
    charges: int
    aborted_keys: int
    processing_keys: int
    journal_entries: int
    journal_open: int
    duplicates: int
    lost: int
    ledger: tuple[LedgerBalance, ...]
    failures: Mapping[str, int]
    sales: int = 0  # sales the journals name (``metadata.sale_id``)
    violations: tuple[Violation, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return not any(self.failures.values())

    def failed(self) -> list[str]:
        return [name for name in INVARIANTS if self.failures.get(name)]


def reported_from_journals(paths: Iterable[str | os.PathLike[str]]) -> dict[str, str]:
    """key → what each journal says the SDK reported: a transaction status, ``aborted``,
    ``error`` (a rejected request) or ``open`` (not definitive)."""
    return {
        entry.key: _journal_outcome(entry.state, entry.outcome) for entry in _journal_entries(paths)
    }


def _journal_outcome(state: JournalState, outcome: Mapping[str, Any] | None) -> str:
    if state is JournalState.ABORTED:
        return "aborted"
    if state is JournalState.REPORTED:  # sold offline, refused for good: never processed
        return "refused"
    if state is not JournalState.RESOLVED:
        return "open"
    status = (outcome or {}).get("status")
    if (outcome or {}).get("kind") == "transaction" and isinstance(status, str):
        return status
    return "error"


def _journal_entries(paths: Iterable[str | os.PathLike[str]]) -> list[JournalEntry]:
    entries: list[JournalEntry] = []
    for path in paths:
        with Journal(path) as journal:
            entries.extend(journal.entries())
    return entries


async def merchant_for_api_key(engine: AsyncEngine, api_key: str) -> str | None:
    async with engine.connect() as conn:
        row = await conn.execute(
            select(ApiKey.merchant_id).where(ApiKey.key_hash == hash_key(api_key))
        )
        return row.scalar_one_or_none()


async def check_invariants(
    engine: AsyncEngine,
    *,
    merchant_ids: Sequence[str],
    reported: Mapping[str, str] | None = None,
    journals: Sequence[str | os.PathLike[str]] = (),
    restored_away: Collection[str] = frozenset(),
) -> InvariantReport:
    """Check contract §8 for ``merchant_ids``. ``reported`` maps each key to what the SDK
    reported (approved | declined | reversed | aborted; in_doubt counts as not definitive;
    anything else, e.g. rejected, is not checked); outcomes recorded in ``journals`` are
    added to it (the journal wins: it is durable)."""
    if not merchant_ids:
        raise ValueError("merchant_ids must not be empty")
    merchants = tuple(merchant_ids)
    entries = _journal_entries(journals)
    from_journals = {e.key: _journal_outcome(e.state, e.outcome) for e in entries}
    claims = {**(reported or {}), **from_journals}
    checker = _Checker()
    async with engine.connect() as conn:
        await _check_reported(conn, merchants, claims, checker, restored_away)
        sales = await _check_sales(conn, merchants, entries, checker)
        charges = await _check_charges(conn, merchants, checker)
        aborted, processing = await _check_keys(conn, merchants, checker)
        ledger = await _ledger_balances(conn, merchants)
        transactions = await _count(conn, Transaction.merchant_id, merchants)
    open_entries = [key for key, claim in claims.items() if claim in NOT_DEFINITIVE]
    for key in open_entries:
        checker.fail("journal_definitive", key, "journal entry is not definitive")
    for balance in ledger:
        if not balance.ok:
            checker.fail(
                "ledger_balanced",
                None,
                f"{balance.merchant_id} {balance.currency}: ledger {balance.ledger} "
                f"!= expected {balance.expected}",
            )
    return InvariantReport(
        merchant_ids=merchants,
        reported=len(claims),
        transactions=transactions,
        charges=charges,
        aborted_keys=aborted,
        processing_keys=processing,
        journal_entries=len(entries),
        journal_open=len(open_entries),
        duplicates=checker.duplicates,
        lost=checker.lost,
        ledger=tuple(ledger),
        sales=sales,
        failures={name: checker.counts[name] for name in INVARIANTS},
        violations=tuple(checker.violations),
    )


class _Checker:
    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.violations: list[Violation] = []
        self.duplicates = 0
        self.lost = 0

    def fail(self, invariant: str, key: str | None, detail: str) -> None:
        self.counts[invariant] += 1
        if len(self.violations) < _MAX_VIOLATIONS:
            self.violations.append(Violation(invariant, key, detail))


async def _check_reported(
    conn: AsyncConnection,
    merchants: tuple[str, ...],
    claims: Mapping[str, str],
    checker: _Checker,
    restored_away: Collection[str] = frozenset(),
) -> None:
    keys = [key for key, claim in claims.items() if claim in PROCESSED or claim in NEVER]
    found: dict[str, list[str]] = {}
    for start in range(0, len(keys), _CHUNK):
        chunk = keys[start : start + _CHUNK]
        rows = await conn.execute(
            select(Transaction.id, Transaction.status).where(
                Transaction.merchant_id.in_(merchants), Transaction.id.in_(chunk)
            )
        )
        for txn_id, status in rows:
            found.setdefault(txn_id, []).append(status)
    for key in keys:
        claim, statuses = claims[key], found.get(key, [])
        if key in restored_away and len(statuses) <= 1:
            continue  # the restore took it back (or it was processed again, once)
        if claim in NEVER:
            if statuses:
                checker.fail("reported_exactly_once", key, f"reported {claim}, held {statuses}")
        elif len(statuses) > 1:
            checker.duplicates += 1
            checker.fail("reported_exactly_once", key, f"{len(statuses)} transactions")
        elif statuses != [claim]:
            checker.lost += 1
            checker.fail("reported_exactly_once", key, f"reported {claim}, held {statuses}")


async def _check_sales(
    conn: AsyncConnection,
    merchants: tuple[str, ...],
    entries: Sequence[JournalEntry],
    checker: _Checker,
) -> int:
    """No customer charged twice for one sale: approved transactions per journal sale id
    (a cashier who re-runs a sale mints a new key for the same sale)."""
    sale_of = {e.key: sale for e in entries if (sale := _sale_id(e)) is not None}
    approved: Counter[str] = Counter()
    keys = list(sale_of)
    for start in range(0, len(keys), _CHUNK):
        rows = await conn.execute(
            select(Transaction.id).where(
                Transaction.merchant_id.in_(merchants),
                Transaction.id.in_(keys[start : start + _CHUNK]),
                Transaction.status == "approved",
            )
        )
        approved.update(sale_of[txn_id] for (txn_id,) in rows)
    for sale, count in sorted(approved.items()):
        if count > 1:
            keys_of = sorted(k for k, s in sale_of.items() if s == sale)
            checker.fail("one_charge_per_sale", sale, f"{count} approved charges: {keys_of}")
    return len(set(sale_of.values()))


def _sale_id(entry: JournalEntry) -> str | None:
    try:
        metadata = entry.request.get("metadata") or {}
    except ValueError:
        return None
    sale = metadata.get("sale_id") if isinstance(metadata, dict) else None
    return sale if isinstance(sale, str) else None


async def _check_charges(
    conn: AsyncConnection, merchants: tuple[str, ...], checker: _Checker
) -> int:
    charge = and_(LedgerEntry.kind == "charge", LedgerEntry.merchant_id.in_(merchants))
    doubled = await conn.execute(
        select(LedgerEntry.transaction_id, func.count())
        .where(charge)
        .group_by(LedgerEntry.merchant_id, LedgerEntry.transaction_id)
        .having(func.count() > 1)
    )
    for txn_id, count in doubled:
        checker.duplicates += 1
        checker.fail("one_charge_per_key", txn_id, f"{count} charge entries")
    orphans = await conn.execute(
        select(LedgerEntry.transaction_id)
        .select_from(LedgerEntry)
        .outerjoin(
            Transaction,
            and_(
                Transaction.merchant_id == LedgerEntry.merchant_id,
                Transaction.id == LedgerEntry.transaction_id,
            ),
        )
        .where(charge, Transaction.id.is_(None))
    )
    for (txn_id,) in orphans:
        checker.fail("charge_has_transaction", txn_id, "charge without a transaction")
    total = await conn.execute(select(func.count()).select_from(LedgerEntry).where(charge))
    return int(total.scalar_one())


async def _check_keys(
    conn: AsyncConnection, merchants: tuple[str, ...], checker: _Checker
) -> tuple[int, int]:
    processed_aborts = await conn.execute(
        select(IdempotencyKey.key)
        .select_from(IdempotencyKey)
        .join(
            Transaction,
            and_(
                Transaction.merchant_id == IdempotencyKey.merchant_id,
                Transaction.id == IdempotencyKey.key,
            ),
        )
        .where(IdempotencyKey.merchant_id.in_(merchants), IdempotencyKey.state == "aborted")
    )
    for (key,) in processed_aborts:
        checker.fail("aborted_not_processed", key, "aborted key has a transaction")
    states = await conn.execute(
        select(IdempotencyKey.state, func.count())
        .where(IdempotencyKey.merchant_id.in_(merchants))
        .group_by(IdempotencyKey.state)
    )
    by_state = {state: int(count) for state, count in states}
    return by_state.get("aborted", 0), by_state.get("processing", 0)


async def _ledger_balances(
    conn: AsyncConnection, merchants: tuple[str, ...]
) -> list[LedgerBalance]:
    ledger = await conn.execute(
        select(LedgerEntry.merchant_id, LedgerEntry.currency, func.sum(LedgerEntry.amount))
        .where(LedgerEntry.merchant_id.in_(merchants))
        .group_by(LedgerEntry.merchant_id, LedgerEntry.currency)
    )
    signed = case((Transaction.type == "refund", -Transaction.amount), else_=Transaction.amount)
    approved = case((Transaction.status.in_(("approved", "reversed")), signed), else_=0)
    reversed_ = case((Transaction.status == "reversed", signed), else_=0)
    expected = await conn.execute(
        select(
            Transaction.merchant_id,
            Transaction.currency,
            func.sum(approved),
            func.sum(reversed_),
        )
        .where(Transaction.merchant_id.in_(merchants))
        .group_by(Transaction.merchant_id, Transaction.currency)
    )
    sums: dict[tuple[str, str], list[int]] = {}
    for merchant, currency, total in ledger:
        sums[(merchant, currency)] = [int(total or 0), 0]
    for merchant, currency, approved_sum, reversed_sum in expected:
        pair = sums.setdefault((merchant, currency), [0, 0])
        pair[1] = int(approved_sum or 0) - int(reversed_sum or 0)
    return [
        LedgerBalance(merchant, currency, ledger_sum, expected_sum)
        for (merchant, currency), (ledger_sum, expected_sum) in sorted(sums.items())
    ]


async def _count(conn: AsyncConnection, column: Any, merchants: tuple[str, ...]) -> int:
    result = await conn.execute(select(func.count()).where(column.in_(merchants)))
    return int(result.scalar_one())
