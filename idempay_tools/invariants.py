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

With ``acquirer_store`` (the simulated acquirer host's store, ``api/acquirer/host/store.py``)
the acquirer's side of contract §8 is checked too, once the reversal-advice queue has
drained (``wait_advice_drained``: polled up to ``drain_within`` seconds — the server's
advice worker must still be running):

| invariant                      | violated by                                               |
|--------------------------------|-----------------------------------------------------------|
| ``acquirer_one_0200_per_key``  | an RRN the acquirer received more than one 0200 for       |
| ``acquirer_advice_drained``    | advices still unacknowledged when the wait ended (depth)  |
| ``acquirer_net_approvals``     | an RRN approved and not reversed at the acquirer that is  |
|                                | not an approved transaction (a customer charged without a |
|                                | sale), or an approved transaction whose RRN the acquirer  |
|                                | did not approve or reversed (a sale without approval)     |
| ``acquirer_timeout_advised``   | a transaction declined ``acquirer_timeout`` with no       |
|                                | acknowledged reversal advice                              |

Everything is scoped to ``merchant_ids`` so a run can be checked on a shared database (the
acquirer's rows by the idempay merchant its field 48 names, and by the RRNs idempay holds).
``restored_away``: keys reported while a database restore took back what they committed
(between the dump and the restore); the database may lack them, and must not hold them
twice.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import and_, case, func, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from api.auth import hash_key
from api.models import AcquirerAdvice, ApiKey, IdempotencyKey, LedgerEntry, Transaction
from client_sdk import Journal, JournalEntry, JournalState

__all__ = [
    "ACQUIRER_INVARIANTS",
    "INVARIANTS",
    "AcquirerCheck",
    "InvariantReport",
    "LedgerBalance",
    "Violation",
    "check_acquirer",
    "check_invariants",
    "merchant_for_api_key",
    "reported_from_journals",
    "wait_advice_drained",
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
ACQUIRER_INVARIANTS = (
    "acquirer_one_0200_per_key",
    "acquirer_advice_drained",
    "acquirer_net_approvals",
    "acquirer_timeout_advised",
)
ACQUIRER_TIMEOUT = "acquirer_timeout"
DRAIN_WITHIN_S = 90.0  # the advice worker backs off 1, 2, 4 … s: a few misses fit
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
    acquirer: AcquirerCheck | None = None  # with ``acquirer_store``: its figures

    @property
    def ok(self) -> bool:
        return not any(self.failures.values())

    def failed(self) -> list[str]:
        """Every failing invariant: the built-in ones in their order, then any other a run
        added (the settlement checks of ``idempay simulate``)."""
        known = (*INVARIANTS, *ACQUIRER_INVARIANTS)
        extra = [name for name in self.failures if name not in known]
        return [name for name in (*known, *extra) if self.failures.get(name)]


@dataclass(frozen=True, slots=True)
class AcquirerCheck:
    """The acquirer's side of contract §8 for some merchants: what its store holds, what
    idempay holds, and where they differ (each ``failures`` entry must be 0).

    ``charged_without_sale``: RRNs approved and not reversed at the acquirer with no
    approved transaction; ``sale_without_approval``: approved transactions (their RRN, or
    ``key:<key>`` for one without an RRN) the acquirer did not approve or reversed."""

    store: str
    rrns: int  # RRNs the acquirer holds for these merchants
    requests: int  # 0200s it received for them
    net_approvals: int  # approved and not reversed
    reversed: int  # approved, then reversed (an advice or a reversal)
    approved: int  # idempay's approved transactions
    timeouts: int  # idempay's transactions declined acquirer_timeout
    advices: int  # reversal advices queued (ever)
    advice_depth: int  # of them not acknowledged when checked
    drain_s: float  # how long the wait for the queue took
    messages: Mapping[str, int]  # the acquirer's message log: "MTI fate" → count (all merchants)
    exempt: int  # RRNs first received in an exempt window (a restore's), not checked
    charged_without_sale: tuple[str, ...]
    sale_without_approval: tuple[str, ...]
    failures: Mapping[str, int]
    violations: tuple[Violation, ...] = ()

    @property
    def ok(self) -> bool:
        return not any(self.failures.values())


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
    acquirer_store: str | os.PathLike[str] | None = None,
    drain_within: float = DRAIN_WITHIN_S,
    acquirer_exempt: Sequence[tuple[datetime, datetime]] = (),
) -> InvariantReport:
    """Check contract §8 for ``merchant_ids``. ``reported`` maps each key to what the SDK
    reported (approved | declined | reversed | aborted; in_doubt counts as not definitive;
    anything else, e.g. rejected, is not checked); outcomes recorded in ``journals`` are
    added to it (the journal wins: it is durable). With ``acquirer_store``, also the
    acquirer's side (``check_acquirer``), after waiting up to ``drain_within`` seconds for
    the advice queue to drain."""
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
    acquirer = None
    if acquirer_store is not None:
        acquirer = await check_acquirer(
            engine,
            merchant_ids=merchants,
            store=acquirer_store,
            drain_within=drain_within,
            exempt_windows=acquirer_exempt,
        )
        checker.merge(acquirer.failures, acquirer.violations)
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
        failures={
            name: checker.counts[name]
            for name in (*INVARIANTS, *(ACQUIRER_INVARIANTS if acquirer else ()))
        },
        violations=tuple(checker.violations),
        acquirer=acquirer,
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

    def merge(self, counts: Mapping[str, int], violations: Iterable[Violation]) -> None:
        self.counts.update(counts)
        room = max(0, _MAX_VIOLATIONS - len(self.violations))
        self.violations.extend(list(violations)[:room])


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


# ---------------------------------------------------------------- the acquirer's side
async def advice_depth(engine: AsyncEngine, merchant_ids: Sequence[str]) -> int:
    """Reversal advices of ``merchant_ids`` not yet acknowledged by a 0430."""
    async with engine.connect() as conn:
        found = await conn.execute(
            select(func.count()).where(
                AcquirerAdvice.merchant_id.in_(tuple(merchant_ids)),
                AcquirerAdvice.acknowledged_at.is_(None),
            )
        )
        return int(found.scalar_one())


async def wait_advice_drained(
    engine: AsyncEngine, merchant_ids: Sequence[str], *, within: float, poll: float = 0.25
) -> tuple[int, float]:
    """Wait (at most ``within`` seconds) until no advice of ``merchant_ids`` is queued:
    (the depth when the wait ended — 0 when it drained, the seconds waited)."""
    started = time.monotonic()
    while True:
        depth = await advice_depth(engine, merchant_ids)
        waited = time.monotonic() - started
        if depth == 0 or waited >= within:
            return depth, waited
        await asyncio.sleep(min(poll, within - waited))


def _first_received(store: str | os.PathLike[str]) -> dict[str, str]:
    import sqlite3
    from contextlib import closing

    with closing(sqlite3.connect(f"file:{Path(store)}?mode=ro", uri=True)) as conn:
        conn.execute("PRAGMA busy_timeout=10000")
        rows = conn.execute("SELECT rrn, first_received_at FROM authorization").fetchall()
    return {str(rrn): str(at) for rrn, at in rows}


def message_fates(store: str | os.PathLike[str]) -> dict[str, int]:
    """The acquirer's message log by MTI and fate (``answered``, ``answer_dropped``,
    ``connection_dropped``, ``dropped_before_decision``, ``connection_closed``, …)."""
    import sqlite3
    from contextlib import closing

    with closing(sqlite3.connect(f"file:{Path(store)}?mode=ro", uri=True)) as conn:
        conn.execute("PRAGMA busy_timeout=10000")
        rows = conn.execute("SELECT mti, fate, count(*) FROM message GROUP BY mti, fate").fetchall()
    return {f"{mti} {fate}": int(count) for mti, fate, count in sorted(rows)}


async def check_acquirer(
    engine: AsyncEngine,
    *,
    merchant_ids: Sequence[str],
    store: str | os.PathLike[str],
    drain_within: float = DRAIN_WITHIN_S,
    exempt_windows: Sequence[tuple[datetime, datetime]] = (),
) -> AcquirerCheck:
    """Contract §8 from the acquirer's side, once the advice queue of ``merchant_ids`` has
    drained (waited for up to ``drain_within`` s; a queue that did not drain fails
    ``acquirer_advice_drained`` with its depth, and the other checks still run):

    - the acquirer received at most one 0200 per RRN (one RRN per key);
    - its approvals net of reversals and idempay's approved transactions are the same RRNs;
    - every transaction declined ``acquirer_timeout`` has an acknowledged advice.

    ``exempt_windows``: (start, end), UTC — a database restore's window (from its dump to
    the API's stop): an RRN the acquirer first received then is not checked by the first
    two (the restore took back the claim, the answer or the advice that covered it: a
    retry sends the key's 0200 again, and a key not retried keeps its approval); counted
    in ``exempt``."""
    from api.acquirer.host.store import summary

    merchants = tuple(merchant_ids)
    depth, waited = await wait_advice_drained(engine, merchants, within=drain_within)
    checker = _Checker()
    if depth:
        checker.fail(
            "acquirer_advice_drained",
            None,
            f"{depth} reversal advices still unacknowledged after {waited:.1f} s",
        )
    async with engine.connect() as conn:
        rows = await conn.execute(
            select(
                Transaction.id, Transaction.status, Transaction.decline_reason, Transaction.rrn
            ).where(Transaction.merchant_id.in_(merchants))
        )
        transactions = [(str(k), str(st), reason, rrn) for k, st, reason, rrn in rows]
        advice_rows = await conn.execute(
            select(AcquirerAdvice.key, AcquirerAdvice.rrn, AcquirerAdvice.acknowledged_at).where(
                AcquirerAdvice.merchant_id.in_(merchants)
            )
        )
        advices = {str(k): (str(rrn), acked is not None) for k, rrn, acked in advice_rows}
    key_of = {rrn: key for key, (rrn, _) in advices.items()}
    key_of.update({rrn: key for key, _, _, rrn in transactions if rrn})
    held = summary(Path(store))
    mine = {rrn: s for rrn, s in held.items() if s.merchant_id in merchants or rrn in key_of}
    exempt: set[str] = set()
    if exempt_windows:
        first = _first_received(store)
        spans = [(a.astimezone(UTC), b.astimezone(UTC)) for a, b in exempt_windows]
        for rrn in list(mine):
            at = datetime.fromisoformat(first[rrn]) if rrn in first else None
            if at is not None and any(a <= at <= b for a, b in spans):
                exempt.add(rrn)
                del mine[rrn]

    def named(rrn: str) -> str:
        return f"key {key_of[rrn]}" if rrn in key_of else "no key of these merchants"

    for rrn, s in sorted(mine.items()):
        if s.requests > 1:
            checker.fail(
                "acquirer_one_0200_per_key", rrn, f"{s.requests} 0200s received ({named(rrn)})"
            )
    net = {rrn for rrn, s in mine.items() if s.approved and not s.reversed}
    approved = {
        rrn or f"key:{key}"
        for key, status, _, rrn in transactions
        if status == "approved" and rrn not in exempt
    }
    status_of = {rrn: (status, reason) for _, status, reason, rrn in transactions if rrn}
    charged = sorted(net - approved)
    unapproved = sorted(approved - net)
    for rrn in charged:
        status, reason = status_of.get(rrn, ("no transaction", None))
        advised = advices.get(key_of.get(rrn, ""))
        advice = "no advice" if advised is None else ("advice acknowledged" if advised[1]
                                                      else "advice queued")  # fmt: skip
        checker.fail(
            "acquirer_net_approvals",
            rrn,
            f"approved at the acquirer, not reversed; idempay: {status}"
            f"{' / ' + reason if reason else ''}, {advice} ({named(rrn)})",
        )
    for rrn in unapproved:
        found = mine.get(rrn)
        if rrn.startswith("key:"):
            seen = "the transaction has no RRN"
        elif found is None:
            seen = "never received"
        elif found.approved:
            seen = f"approved and reversed at {found.reversed_at}"
        else:
            seen = f"{found.state} {found.response_code or ''}".strip()
        checker.fail(
            "acquirer_net_approvals",
            rrn,
            f"approved in idempay; acquirer: {seen} ({named(rrn)})",
        )
    timeouts = [
        (key, rrn)
        for key, status, reason, rrn in transactions
        if status == "declined" and reason == ACQUIRER_TIMEOUT
    ]
    for key, timed_out_rrn in timeouts:
        advised = advices.get(key)
        if advised is None or not advised[1]:
            what = "no reversal advice" if advised is None else "its advice is unacknowledged"
            where = timed_out_rrn or f"key:{key}"
            checker.fail("acquirer_timeout_advised", where, f"key {key}: {what}")
    return AcquirerCheck(
        store=str(store),
        rrns=len(mine),
        requests=sum(s.requests for s in mine.values()),
        net_approvals=len(net),
        reversed=sum(1 for s in mine.values() if s.approved and s.reversed),
        approved=len(approved),
        timeouts=len(timeouts),
        advices=len(advices),
        advice_depth=sum(1 for _, acked in advices.values() if not acked),
        drain_s=waited,
        messages=message_fates(store),
        exempt=len(exempt),
        charged_without_sale=tuple(charged),
        sale_without_approval=tuple(unapproved),
        failures={name: checker.counts[name] for name in ACQUIRER_INVARIANTS},
        violations=tuple(checker.violations),
    )
