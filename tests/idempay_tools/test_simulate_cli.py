"""``idempay simulate`` end to end on a private Postgres database: it starts its own server,
runs a small fleet through the SDK on a lossy link, checks contract §8 and says so — and the
checks themselves catch planted violations."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import insert
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from api.auth import hash_key
from api.models import IdempotencyKey, LedgerEntry, Transaction
from client_sdk import Journal, JournalState
from idempay_tools.invariants import InvariantReport, check_invariants
from tests.support.backend import Backend
from tests.support.services import ROOT, create_database, drop_database, pg_url


@dataclass
class Run:
    returncode: int
    out: str

    def row(self, name: str) -> str:
        """The value cell of the table row ``name``."""
        match = re.search(rf"^\W*{re.escape(name)}\s*\W+\s*(\S+)\s*\W*$", self.out, re.M)
        assert match, f"no row {name!r} in:\n{self.out}"
        return match.group(1)

    def count(self, name: str) -> int:
        return int(self.row(name))


@pytest.fixture(scope="module")
def database() -> Iterator[str]:
    name = create_database("idempay_sim")
    try:
        yield pg_url(name)
    finally:
        drop_database(name)


def simulate(database_url: str, tmp: Path, *args: str) -> Run:
    env = {
        **os.environ,
        "IDEMPAY_DATABASE_URL": database_url,
        "IDEMPAY_VAR_DIR": str(tmp / "var"),
        "IDEMPAY_REDIS_URL": "",
        "COLUMNS": "120",
    }
    workdir = str(tmp / "journals")
    argv = [sys.executable, "-m", "idempay_tools", "simulate", "--workdir", workdir, *args]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    return Run(done.returncode, done.stdout + done.stderr)


def transactions(database_url: str) -> int:
    async def run() -> int:
        engine = create_async_engine(database_url, poolclass=NullPool)
        try:
            async with engine.connect() as conn:
                exists = await conn.exec_driver_sql("SELECT to_regclass('public.transaction')")
                if exists.scalar_one() is None:  # a fresh database: simulate migrates it
                    return 0
                rows = await conn.exec_driver_sql('SELECT count(*) FROM "transaction"')
                return int(rows.scalar_one())
        finally:
            await engine.dispose()

    return asyncio.run(run())


def assert_clean(run: Run, *, payments: int) -> None:
    assert run.returncode == 0, run.out
    assert run.count("payments") == payments
    assert run.count("duplicates") == 0
    assert run.count("lost") == 0
    assert run.count("in-doubt at end") == 0
    assert run.count("approved") + run.count("declined") + run.count("aborted") == payments
    assert run.count("faults injected") > 0
    assert "all invariants hold" in run.out
    assert "FAIL" not in run.out
    assert_settled(run)


def assert_settled(run: Run) -> None:
    """Issue 32: the acquirer's clearing files of the run's days, landed in the run's lake
    and reconciled (DuckDB reference) after the drain: no exception, and every approved
    transaction of the merchant matched."""
    settled = re.search(
        r"settlement against the acquirer's clearing: ([\d,]+) matched over (\d+) days, "
        r"(\d+) exceptions — approved transactions ([\d,]+), ([\d,]+) clearing records",
        run.out,
    )
    assert settled, run.out
    matched, days, exceptions, approved, records = (
        int(g.replace(",", "")) for g in settled.groups()
    )
    assert exceptions == 0 and days >= 1, run.out
    assert matched == approved == run.count("approved transactions") > 0, run.out
    assert records >= matched
    assert run.row("invariant settlement_exceptions") == "ok"
    assert run.row("invariant settlement_matched") == "ok"


def test_simulate_through_the_chaos_proxy_on_postgres(database: str, tmp_path: Path) -> None:
    before = transactions(database)
    run = simulate(
        database,
        tmp_path,
        "--terminals",
        "4",
        "--payments",
        "25",
        "--loss",
        "0.1",
        "--via-proxy",
        "--seed",
        "7",
    )
    assert_clean(run, payments=100)
    assert run.count("lookups") + run.count("retries") > 0
    # the command really ran against this database
    processed = run.count("approved") + run.count("declined")
    assert transactions(database) - before == processed
    journals = sorted((tmp_path / "journals").glob("SIM-*.db"))
    assert len(journals) == 4
    for path in journals:
        with Journal(path) as journal:
            entries = journal.entries()
        assert len(entries) == 25 and all(e.state.is_terminal for e in entries)
    # Issue 19: the run's days exported and audited; the audit's link loss is the proxy's
    # own count of the creates it lost before the server, and it received what was forwarded.
    link = re.search(
        r"proxy: lost before the server (\d+), forwarded (\d+) .*\n\s*"
        r"audit: unseen_attempts (\d+), received (\d+)",
        run.out,
    )
    assert link, run.out
    lost, forwarded, unseen, received = map(int, link.groups())
    assert lost >= 1 and (unseen, received) == (lost, forwarded), run.out
    assert "link loss: agree" in run.out
    assert (tmp_path / "journals" / "audit" / "report.html").is_file()


def test_simulate_kills_terminal_processes_and_recovers_their_journals(
    database: str, tmp_path: Path
) -> None:
    run = simulate(
        database,
        tmp_path,
        "--terminals",
        "4",
        "--payments",
        "25",
        "--loss",
        "0.1",
        "--kill-clients",
        "--seed",
        "3",
    )
    assert_clean(run, payments=100)
    assert run.count("clients killed") >= 1


def test_simulate_reboots_terminals_mid_payment_and_charges_no_customer_twice(
    database: str, tmp_path: Path
) -> None:
    """Issue 24: terminals die before and after a create leaves, reboot on their journal
    (recover() first), and the cashier re-runs the interrupted sale with a new key. Fails
    while recover() still sells a never-sent entry at boot (contract §4)."""
    run = simulate(
        database,
        tmp_path,
        "--terminals",
        "4",
        "--payments",
        "10",
        "--loss",
        "0.05",
        "--reboot-terminals",
        "--seed",
        "3",
    )
    assert run.count("clients killed") == 2, run.out
    assert run.count("sales") == 40
    assert run.count("sales re-run by the cashier") >= 1
    assert run.count("customers charged twice") == 0, run.out
    assert run.returncode == 0 and "all invariants hold" in run.out, run.out


def test_simulate_exits_non_zero_when_an_invariant_fails(
    pg_backend: Backend, tmp_path: Path
) -> None:
    """Against a running server (--url): an aborted key that holds a transaction, planted
    for the merchant before the run, fails ``aborted_not_processed``."""
    api_key = pg_backend.api_key(f"planted-{uuid.uuid4().hex[:8]}")
    merchant_id = _merchant(pg_backend, api_key)
    planted = str(uuid.uuid4())
    asyncio.run(_plant_aborted_with_transaction(pg_backend.url, merchant_id, planted))
    server = pg_backend.server()
    try:
        run = simulate(
            pg_backend.url,
            tmp_path,
            "--url",
            server.url,
            "--api-key",
            api_key,
            "--terminals",
            "2",
            "--payments",
            "5",
            "--loss",
            "0.1",
        )
    finally:
        server.stop()
    assert run.returncode == 1, run.out
    assert run.row("invariant aborted_not_processed") == "FAIL"
    assert run.row("invariant one_charge_per_key") == "ok"
    assert planted in run.out
    assert run.count("duplicates") == 0 and run.count("lost") == 0


def test_the_invariants_catch_lost_payments_open_journals_and_unbalanced_ledgers(
    pg_backend: Backend, tmp_path: Path
) -> None:
    merchant_id = _merchant(pg_backend, pg_backend.api_key(f"checks-{uuid.uuid4().hex[:8]}"))
    unbalanced, lost, charged_abort = (str(uuid.uuid4()) for _ in range(3))
    asyncio.run(_plant_transaction(pg_backend.url, merchant_id, unbalanced, ledger=False))
    asyncio.run(_plant_transaction(pg_backend.url, merchant_id, charged_abort, ledger=True))
    journal = tmp_path / "pos.db"
    with Journal(journal) as pos:
        open_key = str(uuid.uuid4())
        pos.begin(open_key, json.dumps({}), deadline=0.0, reverse_late_approval=False)
        pos.transition(open_key, JournalState.SENT, attempts=1)
    reported = {unbalanced: "approved", lost: "approved", charged_abort: "aborted"}
    report = asyncio.run(_check(pg_backend.url, merchant_id, reported, [journal]))
    assert not report.ok
    assert report.lost == 1 and report.duplicates == 0 and report.journal_open == 1
    assert report.failed() == ["reported_exactly_once", "journal_definitive", "ledger_balanced"]
    assert report.failures["reported_exactly_once"] == 2  # the lost one, the charged abort
    [balance] = report.ledger
    assert (balance.ledger, balance.expected) == (500, 1000)


def test_the_invariants_count_approved_charges_per_sale(
    pg_backend: Backend, tmp_path: Path
) -> None:
    """Two keys of one sale (``metadata.sale_id``), both approved: one customer charged
    twice, though each key holds exactly one charge."""
    merchant_id = _merchant(pg_backend, pg_backend.api_key(f"sales-{uuid.uuid4().hex[:8]}"))
    first, rerun, other = (str(uuid.uuid4()) for _ in range(3))
    for key in (first, rerun, other):
        asyncio.run(_plant_transaction(pg_backend.url, merchant_id, key, ledger=True))
    journal = tmp_path / "pos.db"
    with Journal(journal) as pos:
        for key, sale in ((first, "S-1"), (rerun, "S-1"), (other, "S-2")):
            body = json.dumps({"amount": 500, "metadata": {"sale_id": sale}})
            pos.begin(key, body, deadline=0.0, reverse_late_approval=False)
    report = asyncio.run(_check(pg_backend.url, merchant_id, {}, [journal]))
    assert report.sales == 2
    assert report.failures["one_charge_per_sale"] == 1
    assert report.failures["one_charge_per_key"] == 0
    [violation] = [v for v in report.violations if v.invariant == "one_charge_per_sale"]
    assert violation.key == "S-1" and first in violation.detail and rerun in violation.detail


def _merchant(backend: Backend, api_key: str) -> str:
    [(merchant_id,)] = backend.sql(
        "SELECT merchant_id FROM api_key WHERE key_hash = :h", h=hash_key(api_key)
    )
    return str(merchant_id)


async def _check(
    url: str, merchant_id: str, reported: dict[str, str], journals: list[Path]
) -> InvariantReport:
    engine = create_async_engine(url, poolclass=NullPool)
    try:
        return await check_invariants(
            engine, merchant_ids=[merchant_id], reported=reported, journals=journals
        )
    finally:
        await engine.dispose()


async def _plant_transaction(url: str, merchant_id: str, key: str, *, ledger: bool) -> None:
    now = datetime.now(UTC)
    engine = create_async_engine(url, poolclass=NullPool)
    try:
        async with engine.begin() as conn:
            await conn.execute(
                insert(Transaction).values(
                    merchant_id=merchant_id,
                    id=key,
                    terminal_id="T-PLANT",
                    type="purchase",
                    amount=500,
                    currency="BRL",
                    card_last4="4242",
                    card_brand="visa",
                    card_fingerprint="0" * 64,
                    installments=1,
                    status="approved",
                    created_at=now,
                    processed_at=now,
                )
            )
            if ledger:
                await conn.execute(
                    insert(LedgerEntry).values(
                        entry_id=str(uuid.uuid4()),
                        merchant_id=merchant_id,
                        transaction_id=key,
                        amount=500,
                        currency="BRL",
                        kind="charge",
                        created_at=now,
                    )
                )
    finally:
        await engine.dispose()


async def _plant_aborted_with_transaction(url: str, merchant_id: str, key: str) -> None:
    await _plant_transaction(url, merchant_id, key, ledger=True)
    now = datetime.now(UTC)
    engine = create_async_engine(url, poolclass=NullPool)
    try:
        async with engine.begin() as conn:
            await conn.execute(
                insert(IdempotencyKey).values(
                    merchant_id=merchant_id,
                    key=key,
                    state="aborted",
                    lease_token=0,
                    created_at=now,
                    updated_at=now,
                )
            )
    finally:
        await engine.dispose()


def test_simulate_with_an_outage_sells_offline_and_forwards_every_sale_once(
    database: str, tmp_path: Path
) -> None:
    """``--outage``: half the fleet loses its link for 3 s and sells offline; every stored
    sale is forwarded afterwards and processed exactly once (journal_definitive: none is
    left STORED), under a lossy link as usual."""
    run = simulate(
        database,
        tmp_path,
        "--terminals",
        "4",
        "--payments",
        "20",
        "--loss",
        "0.05",
        "--outage",
        "3",
        "--seed",
        "5",
    )
    assert_clean(run, payments=80)
    assert run.count("sold offline") > 0
    assert run.count("connections refused (outage)") > 0
    assert run.count("stored at end") == 0
    entries = [e for p in (tmp_path / "journals").glob("*.db") for e in Journal(p).entries()]
    offline = [e for e in entries if e.outcome and (e.outcome.get("body") or {}).get("offline")]
    assert len(offline) == run.count("sold offline")
    assert all(e.state is JournalState.RESOLVED for e in offline)
