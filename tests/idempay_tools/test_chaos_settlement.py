"""The settlement reconciliation after a chaos or simulate run
(``idempay_tools._chaos_settlement``, issue 32): on a planted acquirer store and lake, the
clearing file of each day is written from the store and landed, the DuckDB reference
reconciles, and the two invariants — no exception after the drain, the matches the
database's approved transactions one to one — hold on a consistent run and name every
planted violation; RRNs a restore exempts are counted apart, no others."""

from __future__ import annotations

import asyncio
import uuid
from contextlib import closing
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
import pytest

from analytics.lake import TABLES, write_partition
from api.acquirer.host.store import connect
from idempay_tools._chaos_settlement import (
    Approved,
    check_settlement,
    clearing_days,
    first_received_in,
    land_clearing,
    reconcile,
)
from tests.support.backend import Backend

D1, D2 = date(2026, 11, 20), date(2026, 11, 21)
MERCHANT = "mer_settle"


def at(day: date, clock: str) -> datetime:
    return datetime.fromisoformat(f"{day.isoformat()}T{clock}+00:00")


class Planted:
    """The acquirer's store and the run's lake (transactions of D1; empty request events
    and ledger entries, as an export of a day writes them), and the database's approved
    transactions."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.store = root / "acquirer.sqlite3"
        self.lake = root / "lake"
        connect(self.store).close()
        self.transactions: list[dict[str, Any]] = []
        self.approved = Approved()

    def acquirer(
        self,
        rrn: str,
        approved_at: datetime,
        *,
        amount: int = 1000,
        code: str = "000000",
        reversed_at: datetime | None = None,
        received_at: datetime | None = None,
        merchant: str = MERCHANT,
    ) -> None:
        received = (received_at or approved_at - timedelta(milliseconds=200)).isoformat()
        with closing(connect(self.store)) as conn:
            conn.execute(
                "INSERT INTO authorization (rrn, stan, merchant_id, terminal_id,"
                " processing_code, amount, currency, state, response_code,"
                " authorization_code, requests, first_received_at, decided_at, approved_at,"
                " reversed_at) VALUES (?, '000001', ?, 'T-1', ?, ?, 'BRL', 'approved', '00',"
                " 'A1B2C3', 1, ?, ?, ?, ?)",
                (
                    rrn,
                    merchant,
                    code,
                    amount,
                    received,
                    approved_at.isoformat(timespec="microseconds"),
                    approved_at.isoformat(timespec="microseconds"),
                    reversed_at.isoformat(timespec="microseconds") if reversed_at else None,
                ),
            )

    def ours(
        self,
        rrn: str | None,
        created_at: datetime,
        *,
        status: str = "approved",
        kind: str = "purchase",
        amount: int = 1000,
        reason: str | None = None,
        in_database: bool = True,
    ) -> str:
        """A transaction in the lake (and, approved and ``in_database``, the database's)."""
        key = str(uuid.uuid4())
        self.transactions.append(
            {
                "transaction_id": key,
                "merchant_id": MERCHANT,
                "terminal_id": "T-1",
                "type": kind,
                "amount": amount,
                "currency": "BRL",
                "card_fingerprint": "0" * 64,
                "status": status,
                "created_at": created_at,
                "processed_at": created_at,
                "rrn": rrn,
                "decline_reason": reason,
            }
        )
        if status == "approved" and in_database:
            name = f"{MERCHANT}/{key}"
            if rrn is None:
                without = (*self.approved.without_rrn, name)
                self.approved = Approved(self.approved.by_rrn, without)
            else:
                by_rrn = {**self.approved.by_rrn, rrn: name}
                self.approved = Approved(by_rrn, self.approved.without_rrn)
        return key

    def export(self) -> None:
        rows = pa.Table.from_pylist(self.transactions, schema=TABLES["transactions"])
        write_partition(self.lake, "transactions", D1, [rows])
        for table in ("request_events", "ledger_entries"):
            write_partition(self.lake, table, D1, [])

    def consistent(self) -> dict[str, str]:
        """A purchase, a refund and an in-doubt key whose approval its advice reversed, all
        on D1; a purchase created at 23:59:59 on D1 that the acquirer approved at 00:00:01
        on D2 (the next day's clearing file)."""
        rrns = {name: uuid.uuid4().hex[:12].upper() for name in ("a", "r", "t", "b")}
        self.ours(rrns["a"], at(D1, "10:00:00"))
        self.acquirer(rrns["a"], at(D1, "10:00:00.300"))
        self.ours(rrns["r"], at(D1, "11:00:00"), kind="refund", amount=300)
        self.acquirer(rrns["r"], at(D1, "11:00:00.300"), amount=300, code="200000")
        self.ours(rrns["t"], at(D1, "12:00:00"), status="declined", reason="acquirer_timeout")
        self.acquirer(rrns["t"], at(D1, "12:00:05"), reversed_at=at(D1, "12:00:20"))
        self.ours(rrns["b"], at(D1, "23:59:59"))
        self.acquirer(rrns["b"], at(D2, "00:00:01"))
        return rrns

    def reconcile(self, *, exempt: frozenset[str] = frozenset()) -> Any:
        self.export()
        days = clearing_days(self.store, [D1])
        records = land_clearing(self.store, days, self.root / "clearing", self.lake)
        return reconcile(
            self.lake, days=days, approved=self.approved, exempt=exempt, records=records
        )


@pytest.fixture
def planted(tmp_path: Path) -> Planted:
    return Planted(tmp_path)


def test_a_consistent_run_matches_every_approved_transaction_across_midnight(
    planted: Planted,
) -> None:
    planted.consistent()
    settlement = planted.reconcile()
    assert settlement.days == (D1, D2)  # D2 from the store: the approval after midnight
    assert settlement.records == 4
    assert (settlement.matched, settlement.approved) == (3, 3)
    assert settlement.matched_amount == 1000 - 300 + 1000
    assert settlement.exceptions == () and settlement.unmatched == ()
    assert settlement.ok and {n for _, n in settlement.rows()} == {0}
    assert [name for name, _ in settlement.rows()] == [
        "settlement exceptions after drain",
        "settlement: matched ≠ the approved transactions (by RRN)",
    ]
    assert "3 matched over 2 days, 0 exceptions" in settlement.line()
    for day in (D1, D2):  # the files as delivered, and landed
        assert (planted.root / "clearing" / f"clearing-{day}.csv").is_file()
        assert (planted.lake / "clearing" / f"clearing_date={day}").is_dir()


def test_each_planted_violation_is_named(planted: Planted) -> None:
    planted.consistent()
    lost = uuid.uuid4().hex[:12].upper()  # a lost answer left unreversed: acquirer_only
    timed_out = planted.ours(lost, at(D1, "13:00:00"), status="declined", reason="acquirer_timeout")
    planted.acquirer(lost, at(D1, "13:00:01"))
    unpaid = uuid.uuid4().hex[:12].upper()  # approved by us, reversed there: ours_only
    sale = planted.ours(unpaid, at(D1, "14:00:00"))
    planted.acquirer(unpaid, at(D1, "14:00:00.200"), reversed_at=at(D1, "14:00:30"))
    odd = uuid.uuid4().hex[:12].upper()  # matched by rrn, another amount
    planted.ours(odd, at(D1, "15:00:00"), amount=999)
    planted.acquirer(odd, at(D1, "15:00:00.200"), amount=1999)
    no_rrn = planted.ours(None, at(D1, "16:00:00"))  # approved, never reconcilable
    settlement = planted.reconcile()
    kinds = {(row["kind"], row["rrn"]) for row in settlement.exceptions}
    assert kinds == {("acquirer_only", lost), ("ours_only", unpaid), ("amount_mismatch", odd)}
    acquirer_only = next(r for r in settlement.exceptions if r["kind"] == "acquirer_only")
    assert acquirer_only["transaction_id"] == timed_out
    assert acquirer_only["clearing_amount"] == 1000
    assert settlement.matched == 3 and settlement.approved == 6
    assert len(settlement.unmatched) == 3, settlement.unmatched
    named = "\n".join(settlement.named())
    for rrn in (lost, unpaid, odd):
        assert named.count(rrn) >= 1, named
    assert f"{MERCHANT}/{sale} (rrn {unpaid}) not matched" in named
    assert f"{MERCHANT}/{no_rrn} has no RRN" in named
    assert "acquirer_only on 2026-11-20: merchant mer_settle" in named
    assert not settlement.ok and dict(settlement.rows()) == {
        "settlement exceptions after drain": 3,
        "settlement: matched ≠ the approved transactions (by RRN)": 3,
    }


def test_a_transaction_missing_from_the_lake_is_named(planted: Planted) -> None:
    """Approved in the database, never exported: the acquirer's approval is an
    acquirer_only exception, and the approved transaction is not matched."""
    planted.consistent()
    rrn = uuid.uuid4().hex[:12].upper()
    key = planted.ours(rrn, at(D1, "17:00:00"))
    planted.transactions.pop()  # not in the lake
    planted.acquirer(rrn, at(D1, "17:00:00.100"))
    settlement = planted.reconcile()
    assert [(r["kind"], r["rrn"]) for r in settlement.exceptions] == [("acquirer_only", rrn)]
    assert settlement.unmatched == (
        f"approved transaction {MERCHANT}/{key} (rrn {rrn}) not matched with the clearing",
    )


def test_rrns_a_restore_exempts_are_counted_apart_and_no_others(planted: Planted) -> None:
    """A key the acquirer first received between a dump and its restore, taken back by the
    restore and never retried: its approval is acquirer_only, exempt as the acquirer
    check exempts it (``invariants.check_acquirer``); one received before is not. Another
    taken back after the lake had it (the export keeps rows the database lost): matched,
    counted apart from the database's approved transactions."""
    rrns = planted.consistent()
    dump = at(D1, "18:00:00")
    restored, before = uuid.uuid4().hex[:12].upper(), uuid.uuid4().hex[:12].upper()
    planted.acquirer(restored, at(D1, "18:00:03"), received_at=at(D1, "18:00:02"))
    planted.acquirer(before, at(D1, "17:59:59"), received_at=at(D1, "17:59:58"))
    kept = uuid.uuid4().hex[:12].upper()
    planted.ours(kept, at(D1, "18:00:04"), in_database=False)
    planted.acquirer(kept, at(D1, "18:00:04.200"), received_at=at(D1, "18:00:04"))
    exempt = first_received_in(planted.store, [(dump, at(D1, "18:00:10"))])
    assert exempt == {restored, kept}
    assert first_received_in(planted.store, []) == frozenset()
    settlement = planted.reconcile(exempt=exempt)
    assert [r["rrn"] for r in settlement.exempt_exceptions] == [restored]
    assert [(r["kind"], r["rrn"]) for r in settlement.exceptions] == [("acquirer_only", before)]
    assert settlement.exempt_rrns == 2 and settlement.unmatched == ()
    assert (settlement.matched, settlement.matched_exempt, settlement.approved) == (4, 1, 3)
    assert rrns["a"] not in {r["rrn"] for r in settlement.exceptions}
    assert "(1 more on RRNs a restore exempts)" in settlement.line()


def test_only_the_given_merchants_are_held_to_it(planted: Planted) -> None:
    """``idempay simulate`` on a database shared with other runs: another merchant's
    exceptions are not this run's."""
    planted.consistent()
    other = uuid.uuid4().hex[:12].upper()
    planted.acquirer(other, at(D1, "19:00:00"), merchant="mer_other")
    planted.export()
    days = clearing_days(planted.store, [D1])
    land_clearing(planted.store, days, planted.root / "clearing", planted.lake)
    everyone = reconcile(planted.lake, days=days, approved=planted.approved)
    assert [r["rrn"] for r in everyone.exceptions] == [other]
    ours = reconcile(planted.lake, days=days, approved=planted.approved, merchants=[MERCHANT])
    assert ours.ok and ours.matched == 3


def test_check_settlement_reads_the_approved_transactions_from_the_database(
    private_sqlite_backend: Backend, tmp_path: Path
) -> None:
    """End to end on a real database: its approved transactions exported to the lake by
    ``idempay export``, the acquirer's approvals of them in the store; one approved
    transaction the acquirer reversed is named twice (ours_only, not matched)."""
    from api.db import create_engine
    from api.events.export import export_day

    today = datetime.now(UTC).date()
    planted = Planted(tmp_path)
    rrns = [uuid.uuid4().hex[:12].upper() for _ in range(3)]
    for n, rrn in enumerate(rrns):
        private_sqlite_backend.sql(
            'INSERT INTO "transaction" (merchant_id, id, terminal_id, type, amount, currency,'
            " card_last4, card_brand, card_fingerprint, installments, status, created_at,"
            " processed_at, rrn) VALUES (:m, :k, 'T-1', 'purchase', 700, 'BRL', '4242', 'visa',"
            " :f, 1, 'approved', :at, :at, :rrn)",
            m=MERCHANT,
            k=str(uuid.uuid4()),
            f="0" * 64,
            at=datetime.now(UTC),
            rrn=rrn,
        )
        reversed_at = datetime.now(UTC) if n == 2 else None
        planted.acquirer(rrn, datetime.now(UTC), amount=700, reversed_at=reversed_at)

    async def run() -> Any:
        engine = create_engine(private_sqlite_backend.settings)
        try:
            await export_day(engine, planted.lake, today)
        finally:
            await engine.dispose()
        return await check_settlement(
            database_url=private_sqlite_backend.url,
            store=planted.store,
            lake=planted.lake,
            folder=tmp_path / "clearing",
            run_days=[today],
            merchants=[MERCHANT],
        )

    settlement = asyncio.run(run())
    assert (settlement.matched, settlement.approved, settlement.records) == (2, 3, 3)
    assert [(r["kind"], r["rrn"]) for r in settlement.exceptions] == [("ours_only", rrns[2])]
    assert len(settlement.unmatched) == 1 and rrns[2] in settlement.unmatched[0]
