"""The settlement reconciliation after a run (issue 32; contract §2.9, §5, §8): once the
reversal-advice queue has drained and the run's days are in the lake, the acquirer's
clearing file of each day is written from its own store (``write_clearing``), landed in
the lake as ``idempay lake add-clearing`` does (``land_clearing_file``), and the lake is
reconciled by the DuckDB reference (``analytics.duckdb_reference``: settlement_recon and
settlement_exceptions, the tables the Spark audit computes). Used by ``make chaos``
(``idempay_tools.chaos``) and ``idempay simulate`` (``idempay_tools.simulate_run``).

Two checks, each 0 on a healthy run:

- **settlement exceptions after drain**: every exception the reconciliation finds
  (acquirer_only, ours_only, amount_mismatch, duplicate_rrn), each named;
- **matched ≠ the approved transactions**: the RRNs the reconciliation matched — the lake's
  approved transactions of the clearing days less those it reports ``ours_only`` or
  ``amount_mismatch``, their number the reference's own ``matched`` — are the database's
  approved transactions one to one (an approved transaction without an RRN, or missing
  from the lake, is not matched and is named; so is a clearing day the reference did not
  reconcile).

``exempt_windows`` (the chaos run's database restores, from the dump to the API's stop):
as in ``idempay_tools.invariants.check_acquirer``, an RRN the acquirer first received then
is not checked by either (the restore took back what covered it); its exceptions are
counted apart, named.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

EXCEPTION_KINDS = ("acquirer_only", "ours_only", "amount_mismatch", "duplicate_rrn")
NOT_MATCHED = frozenset({"ours_only", "amount_mismatch"})  # an approved transaction's fate
THREADS = 2
MAX_NAMED = 20


@dataclass(frozen=True)
class Settlement:
    """The reconciliation of one run's lake against the acquirer's clearing files."""

    days: tuple[date, ...]  # the clearing days landed (and reconciled)
    records: int  # D records in those files
    matched: int  # the reference's matched, over the days (the merchants checked)
    matched_amount: int
    approved: int  # the database's approved transactions (the merchants checked, not exempt)
    exceptions: tuple[dict[str, Any], ...]  # settlement_exceptions rows, not exempt
    unmatched: tuple[str, ...]  # why matched ≠ approved, one line per RRN (or day)
    exempt_exceptions: tuple[dict[str, Any], ...] = ()  # on an RRN a restore exempts
    exempt_rrns: int = 0  # RRNs first received in an exempt window
    matched_exempt: int = 0  # of ``matched``: on an exempt RRN (not held to the database)
    clearing_dir: str = ""

    def rows(self) -> list[tuple[str, int]]:
        """(check, violations) for the invariants table: both must be 0."""
        return [
            ("settlement exceptions after drain", len(self.exceptions)),
            ("settlement: matched ≠ the approved transactions (by RRN)", len(self.unmatched)),
        ]

    @property
    def ok(self) -> bool:
        return not self.exceptions and not self.unmatched

    def named(self) -> list[str]:
        """Each exception and each mismatch, one line each (the first ``MAX_NAMED`` of each)."""
        lines = [f"settlement exception {describe(row)}" for row in self.exceptions[:MAX_NAMED]]
        lines += [f"settlement: {what}" for what in self.unmatched[:MAX_NAMED]]
        return lines

    def line(self) -> str:
        """The reconciliation in one line, worded as ``make demo`` says it."""
        exempt = (
            f" ({len(self.exempt_exceptions)} more on RRNs a restore exempts)"
            if self.exempt_exceptions
            else ""
        )
        return (
            f"settlement against the acquirer's clearing: {self.matched:,} matched over "
            f"{len(self.days)} days, {len(self.exceptions)} exceptions{exempt} — approved "
            f"transactions {self.approved:,}, {self.records:,} clearing records"
        )

    def figures(self) -> list[tuple[str, str]]:
        """(measure, value) rows for a report."""
        return [
            (
                "settlement: clearing days / records landed",
                f"{len(self.days)} / {self.records}",
            ),
            (
                "settlement: matched (of them on RRNs exempt) / approved transactions (database)",
                f"{self.matched} ({self.matched_exempt}) / {self.approved}",
            ),
            ("settlement: matched amount (minor units, net)", str(self.matched_amount)),
            (
                "settlement: exceptions / on RRNs exempt (restore) / RRNs exempt",
                f"{len(self.exceptions)} / {len(self.exempt_exceptions)} / {self.exempt_rrns}",
            ),
        ]


@dataclass(frozen=True)
class Approved:
    """The database's approved transactions: RRN → "merchant/key", and those without an RRN."""

    by_rrn: dict[str, str] = field(default_factory=dict)
    without_rrn: tuple[str, ...] = ()


def describe(row: dict[str, Any]) -> str:
    """An exception row as one line: kind, day, merchant, rrn, transaction, amounts."""
    return (
        f"{row.get('kind')} on {row.get('event_date')}: merchant {row.get('merchant_id')}, "
        f"rrn {row.get('rrn')}, transaction {row.get('transaction_id') or '—'}, amount "
        f"{_money(row.get('amount'))} {row.get('currency') or ''}, clearing amount "
        f"{_money(row.get('clearing_amount'))}"
    )


def _money(value: Any) -> str:
    return "—" if value is None else str(value)


def store_days(store: Path) -> list[date]:
    """The UTC days on which the acquirer approved anything (its clock)."""
    import sqlite3

    with closing(sqlite3.connect(f"file:{store}?mode=ro", uri=True)) as conn:
        conn.execute("PRAGMA busy_timeout=10000")
        rows = conn.execute(
            "SELECT DISTINCT substr(approved_at, 1, 10) FROM authorization"
            " WHERE state = 'approved' AND approved_at IS NOT NULL"
        ).fetchall()
    return [date.fromisoformat(day) for (day,) in rows]


def first_received_in(store: Path, windows: Sequence[tuple[datetime, datetime]]) -> frozenset[str]:
    """RRNs the acquirer first received inside one of ``windows`` (UTC)."""
    if not windows:
        return frozenset()
    from idempay_tools.invariants import _first_received

    spans = [(a.astimezone(UTC), b.astimezone(UTC)) for a, b in windows]
    found = set()
    for rrn, at in _first_received(store).items():
        moment = datetime.fromisoformat(at)
        if any(a <= moment <= b for a, b in spans):
            found.add(rrn)
    return frozenset(found)


def land_clearing(store: Path, days: Sequence[date], folder: Path, lake: Path) -> int:
    """Each day's clearing file written from the store into ``folder`` and landed in
    ``lake``; the number of D records over the days."""
    from api.acquirer.host.clearing import write_clearing
    from idempay_tools.cli_lake import land_clearing_file

    records = 0
    for day in days:
        path = folder / f"clearing-{day.isoformat()}.csv"
        write_clearing(store, day=day, out=path)
        records += land_clearing_file(path, lake, day=day).rows
    return records


def lake_approved(lake: Path, days: Sequence[date], merchants: Collection[str] | None) -> set[str]:
    """RRNs of the lake's approved transactions created on ``days`` (those of
    ``merchants``, when given)."""
    import duckdb

    files = f"{Path(lake).as_posix()}/transactions/event_date=????-??-??/*.parquet"
    conn = duckdb.connect()
    try:
        conn.execute("SET TimeZone = 'UTC'")
        rows = conn.execute(
            "SELECT merchant_id, rrn, CAST(created_at AS DATE) FROM ("
            " SELECT DISTINCT ON (merchant_id, transaction_id) merchant_id, transaction_id,"
            " rrn, status, created_at"
            f" FROM read_parquet('{files}', hive_partitioning = false, union_by_name = true))"
            " WHERE status = 'approved' AND rrn IS NOT NULL"
        ).fetchall()
    finally:
        conn.close()
    wanted = set(days)
    return {
        str(rrn)
        for merchant, rrn, day in rows
        if day in wanted and (merchants is None or merchant in merchants)
    }


def reconcile(
    lake: Path,
    *,
    days: Sequence[date],
    approved: Approved,
    merchants: Collection[str] | None = None,
    exempt: Collection[str] = frozenset(),
    records: int = 0,
    clearing_dir: str = "",
) -> Settlement:
    """The DuckDB reference over ``lake`` for ``days`` (their clearing landed), held to the
    database's ``approved`` transactions; only ``merchants``' rows when given (a database
    shared with other runs), RRNs in ``exempt`` counted apart."""
    from analytics.duckdb_reference import audit

    days = sorted(set(days))
    tables = audit(lake, start=days[0], end=days[-1], threads=THREADS)

    def ours(row: dict[str, Any]) -> bool:
        return merchants is None or row["merchant_id"] in merchants

    recon = [r for r in tables["settlement_recon"] if r["merchant_id"] != "ALL" and ours(r)]
    reconciled = {r["event_date"] for r in tables["settlement_recon"] if r["merchant_id"] == "ALL"}
    found = [r for r in tables["settlement_exceptions"] if ours(r)]
    exceptions = tuple(r for r in found if r["rrn"] not in exempt)
    exempted = tuple(r for r in found if r["rrn"] in exempt)
    matched = sum(int(r["matched"]) for r in recon)
    not_matched = {r["rrn"] for r in found if r["kind"] in NOT_MATCHED}
    matched_rrns = lake_approved(lake, days, merchants) - not_matched
    unmatched = [
        f"clearing day {day} not reconciled by the reference (its landed files refused?)"
        for day in days
        if day.isoformat() not in reconciled
    ]
    if len(matched_rrns) != matched:
        unmatched.append(
            f"the reference matched {matched}, the lake's approved transactions less their "
            f"ours_only / amount_mismatch exceptions are {len(matched_rrns)}"
        )
    expected = {rrn: key for rrn, key in approved.by_rrn.items() if rrn not in exempt}
    unmatched += [
        f"approved transaction {expected[rrn]} (rrn {rrn}) not matched with the clearing"
        for rrn in sorted(expected.keys() - matched_rrns)
    ]
    unmatched += [
        f"rrn {rrn} matched with the clearing, not an approved transaction in the database"
        for rrn in sorted(matched_rrns - expected.keys() - set(exempt))
    ]
    unmatched += [
        f"approved transaction {key} has no RRN: never reconcilable" for key in approved.without_rrn
    ]
    return Settlement(
        days=tuple(days),
        records=records,
        matched=matched,
        matched_amount=sum(int(r["matched_amount"]) for r in recon),
        approved=len(expected) + len(approved.without_rrn),
        exceptions=exceptions,
        unmatched=tuple(unmatched),
        exempt_exceptions=exempted,
        exempt_rrns=len(exempt),
        matched_exempt=len(matched_rrns & set(exempt)),
        clearing_dir=clearing_dir,
    )


async def database_approved(
    database_url: str | None, merchants: Collection[str] | None = None
) -> Approved:
    """The configured (or given) database's approved transactions, of ``merchants`` only
    when given."""
    from sqlalchemy import select

    from api.config import Settings
    from api.db import create_engine
    from api.models import Transaction

    settings = Settings(database_url=database_url) if database_url else Settings()
    engine = create_engine(settings)
    query = select(Transaction.merchant_id, Transaction.id, Transaction.rrn).where(
        Transaction.status == "approved"
    )
    if merchants is not None:
        query = query.where(Transaction.merchant_id.in_(list(merchants)))
    try:
        async with engine.connect() as conn:
            rows = (await conn.execute(query)).all()
    finally:
        await engine.dispose()
    by_rrn = {str(rrn): f"{merchant}/{key}" for merchant, key, rrn in rows if rrn}
    without = tuple(sorted(f"{merchant}/{key}" for merchant, key, rrn in rows if not rrn))
    return Approved(by_rrn, without)


def clearing_days(store: Path, run_days: Sequence[date]) -> list[date]:
    """The run's days and every day the acquirer approved anything (an authorization
    approved just after midnight belongs to the next day's file)."""
    return sorted(set(run_days) | set(store_days(store)))


async def check_settlement(
    *,
    database_url: str | None,
    store: Path,
    lake: Path,
    folder: Path,
    run_days: Sequence[date],
    merchants: Collection[str] | None = None,
    exempt_windows: Sequence[tuple[datetime, datetime]] = (),
) -> Settlement:
    """After the advice queue drained and the run's days were exported to ``lake``: the
    clearing file of each day written from ``store`` into ``folder``, landed in ``lake``,
    and the reconciliation held to the database (``database_url``, else the configured
    one). The files and DuckDB run in a thread (a caller may bound this with a timeout)."""
    approved = await database_approved(database_url, merchants)

    def run() -> Settlement:
        days = clearing_days(store, run_days)
        records = land_clearing(store, days, folder, lake)
        return reconcile(
            lake,
            days=days,
            approved=approved,
            merchants=merchants,
            exempt=first_received_in(store, exempt_windows),
            records=records,
            clearing_dir=str(folder),
        )

    return await asyncio.to_thread(run)


def days_since(first: date, last: date | None = None) -> list[date]:
    """Every UTC day from ``first`` to ``last`` (today by default)."""
    last = last or datetime.now(UTC).date()
    return [first + timedelta(days=n) for n in range((last - first).days + 1)]
