"""Contract §8 from the acquirer's side (``idempay_tools.invariants.check_acquirer``): each
check on a planted acquirer store and database — consistent, it holds; each planted
violation is reported by RRN — and ``idempay simulate`` with acquirer faults, end to end,
printing the checks and holding them."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import uuid
from contextlib import closing
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import insert
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from api.acquirer.host.store import connect
from api.models import AcquirerAdvice, Transaction
from idempay_tools.invariants import (
    ACQUIRER_INVARIANTS,
    AcquirerCheck,
    check_acquirer,
    check_invariants,
)
from tests.support.backend import Backend
from tests.support.services import ROOT, create_database, drop_database, pg_url


class Planted:
    """One merchant's transactions and advices in the database, and the acquirer's store."""

    def __init__(self, backend: Backend, store: Path) -> None:
        self.url = backend.url
        self.merchant = f"acq-{uuid.uuid4().hex[:10]}"
        self.store = store
        connect(store).close()  # the host's schema, empty

    def rrn(self) -> str:
        return uuid.uuid4().hex[:12].upper()

    def acquirer(
        self, rrn: str, *, state: str = "approved", requests: int = 1, reversed_: bool = False
    ) -> None:
        now = datetime.now(UTC).isoformat()
        with closing(connect(self.store)) as conn:
            conn.execute(
                "INSERT INTO authorization (rrn, merchant_id, terminal_id, processing_code,"
                " amount, currency, state, response_code, requests, first_received_at,"
                " approved_at, reversed_at) VALUES (?, ?, 'T-1', '000000', 500, '986', ?, ?,"
                " ?, ?, ?, ?)",
                (
                    rrn,
                    self.merchant,
                    state,
                    "00" if state == "approved" else "51",
                    requests,
                    now,
                    now if state == "approved" else None,
                    now if reversed_ else None,
                ),
            )

    def transaction(self, rrn: str | None, *, status: str, reason: str | None = None) -> str:
        key = str(uuid.uuid4())
        now = datetime.now(UTC)
        self._insert(
            Transaction,
            merchant_id=self.merchant,
            id=key,
            terminal_id="T-1",
            type="purchase",
            amount=500,
            currency="BRL",
            card_last4="4242",
            card_brand="visa",
            card_fingerprint="0" * 64,
            installments=1,
            status=status,
            decline_reason=reason,
            created_at=now,
            processed_at=now,
            rrn=rrn,
        )
        return key

    def advice(self, key: str, rrn: str, *, acknowledged: bool) -> None:
        now = datetime.now(UTC)
        self._insert(
            AcquirerAdvice,
            merchant_id=self.merchant,
            key=key,
            kind="timeout",
            rrn=rrn,
            terminal_id="T-1",
            type="purchase",
            amount=500,
            currency="BRL",
            original_stan="000001",
            created_at=now,
            attempts=1,
            next_attempt_at=now,
            acknowledged_at=now if acknowledged else None,
        )

    def _insert(self, table: Any, **values: Any) -> None:
        async def run() -> None:
            engine = create_async_engine(self.url, poolclass=NullPool)
            try:
                async with engine.begin() as conn:
                    await conn.execute(insert(table).values(**values))
            finally:
                await engine.dispose()

        asyncio.run(run())

    def consistent(self) -> None:
        """An approval; an in-doubt key whose approval was reversed by its advice; a decline."""
        approved = self.rrn()
        self.transaction(approved, status="approved")
        self.acquirer(approved)
        in_doubt = self.rrn()
        key = self.transaction(in_doubt, status="declined", reason="acquirer_timeout")
        self.advice(key, in_doubt, acknowledged=True)
        self.acquirer(in_doubt, reversed_=True)
        declined = self.rrn()
        self.transaction(declined, status="declined", reason="insufficient_funds")
        self.acquirer(declined, state="declined")

    def check(
        self, *, drain_within: float = 0.0, exempt: list[tuple[datetime, datetime]] | None = None
    ) -> AcquirerCheck:
        async def run() -> AcquirerCheck:
            engine = create_async_engine(self.url, poolclass=NullPool)
            try:
                return await check_acquirer(
                    engine,
                    merchant_ids=[self.merchant],
                    store=self.store,
                    drain_within=drain_within,
                    exempt_windows=exempt or [],
                )
            finally:
                await engine.dispose()

        return asyncio.run(run())


@pytest.fixture
def planted(backend: Backend, tmp_path: Path) -> Planted:
    return Planted(backend, tmp_path / "acquirer.sqlite3")


def failing(check: AcquirerCheck) -> dict[str, int]:
    return {name: n for name, n in check.failures.items() if n}


def test_a_consistent_acquirer_and_database_hold_every_check(planted: Planted) -> None:
    planted.consistent()
    check = planted.check()
    assert check.ok, check.violations
    assert set(check.failures) == set(ACQUIRER_INVARIANTS)
    assert (check.rrns, check.requests, check.net_approvals, check.approved) == (3, 3, 1, 1)
    assert (check.reversed, check.timeouts, check.advices, check.advice_depth) == (1, 1, 1, 0)


def test_a_second_0200_for_one_rrn_is_reported(planted: Planted) -> None:
    planted.consistent()
    twice = planted.rrn()
    key = planted.transaction(twice, status="approved")
    planted.acquirer(twice, requests=2)
    check = planted.check()
    assert failing(check) == {"acquirer_one_0200_per_key": 1}
    [violation] = check.violations
    assert violation.key == twice and "2 0200s" in violation.detail and key in violation.detail


def test_an_approval_the_acquirer_kept_for_a_key_idempay_declined_is_reported(
    planted: Planted,
) -> None:
    """A customer charged without a sale: idempay settled the key declined
    acquirer_timeout, its advice was acknowledged, yet the acquirer holds the approval."""
    planted.consistent()
    charged = planted.rrn()
    key = planted.transaction(charged, status="declined", reason="acquirer_timeout")
    planted.advice(key, charged, acknowledged=True)
    planted.acquirer(charged)
    check = planted.check()
    assert failing(check) == {"acquirer_net_approvals": 1}
    assert check.charged_without_sale == (charged,) and check.sale_without_approval == ()
    [violation] = check.violations
    assert violation.key == charged and key in violation.detail


def test_an_approved_sale_the_acquirer_declined_or_reversed_or_never_saw_is_reported(
    planted: Planted,
) -> None:
    planted.consistent()
    declined, reversed_, unseen = planted.rrn(), planted.rrn(), planted.rrn()
    for rrn in (declined, reversed_, unseen):
        planted.transaction(rrn, status="approved")
    planted.acquirer(declined, state="declined")
    planted.acquirer(reversed_, reversed_=True)
    no_rrn = planted.transaction(None, status="approved")
    check = planted.check()
    assert failing(check) == {"acquirer_net_approvals": 4}
    assert set(check.sale_without_approval) == {declined, reversed_, unseen, f"key:{no_rrn}"}
    details = {v.key: v.detail for v in check.violations}
    assert "declined 51" in details[declined]
    assert "reversed" in details[reversed_]
    assert "never received" in details[unseen]
    assert "no RRN" in details[f"key:{no_rrn}"]


def test_an_undrained_advice_queue_is_reported_with_its_depth_after_the_bound(
    private_backend: Backend, tmp_path: Path
) -> None:
    """The advice of an in-doubt key never acknowledged (no worker runs here: a database of
    its own, where no other module's server has an advice worker to send it): the wait
    ends at its bound and reports the depth; the approval it should have reversed and the
    timeout without an acknowledged advice are reported too."""
    planted = Planted(private_backend, tmp_path / "acquirer.sqlite3")
    planted.consistent()
    stuck = planted.rrn()
    key = planted.transaction(stuck, status="declined", reason="acquirer_timeout")
    planted.advice(key, stuck, acknowledged=False)
    planted.acquirer(stuck)
    check = planted.check(drain_within=0.5)
    assert failing(check) == {
        "acquirer_advice_drained": 1,
        "acquirer_net_approvals": 1,
        "acquirer_timeout_advised": 1,
    }
    assert check.advice_depth == 1 and check.drain_s >= 0.5
    drained = next(v for v in check.violations if v.invariant == "acquirer_advice_drained")
    assert drained.detail.startswith("1 reversal advices still unacknowledged")
    advised = next(v for v in check.violations if v.invariant == "acquirer_timeout_advised")
    assert advised.key == stuck and "unacknowledged" in advised.detail


def test_a_timeout_without_any_advice_is_reported(planted: Planted) -> None:
    planted.consistent()
    lonely = planted.rrn()
    key = planted.transaction(lonely, status="declined", reason="acquirer_timeout")
    check = planted.check()
    assert failing(check) == {"acquirer_timeout_advised": 1}
    [violation] = check.violations
    assert violation.key == lonely and f"key {key}: no reversal advice" == violation.detail


def test_rrns_first_received_in_a_restore_window_are_exempt_and_no_others(
    planted: Planted,
) -> None:
    """A restore took back the claim of a key the acquirer had approved, and its retry sent
    the 0200 again: first received inside the window, it is not checked (counted)."""
    planted.consistent()
    before = datetime.now(UTC) - timedelta(seconds=5)
    restored = planted.rrn()
    planted.acquirer(restored, requests=2)  # no transaction: the restore took it back
    after = datetime.now(UTC) + timedelta(seconds=5)
    check = planted.check(exempt=[(before, after)])
    assert check.ok and check.exempt == 4  # the three consistent ones were received then too
    elsewhere = planted.check(exempt=[(after, after + timedelta(seconds=60))])
    assert failing(elsewhere) == {"acquirer_one_0200_per_key": 1, "acquirer_net_approvals": 1}
    assert elsewhere.exempt == 0


def test_another_merchants_rows_are_not_checked(planted: Planted, backend: Backend) -> None:
    planted.consistent()
    other = Planted(backend, planted.store)
    twice = other.rrn()
    other.transaction(twice, status="declined", reason="acquirer_timeout")
    other.acquirer(twice, requests=3)
    assert planted.check().ok
    assert not other.check().ok


def test_check_invariants_adds_the_acquirer_rows_only_when_given_a_store(
    planted: Planted,
) -> None:
    planted.consistent()
    twice = planted.rrn()
    planted.transaction(twice, status="declined", reason="insufficient_funds")
    planted.acquirer(twice, state="declined", requests=2)

    async def run(store: Path | None) -> Any:
        engine = create_async_engine(planted.url, poolclass=NullPool)
        try:
            return await check_invariants(
                engine, merchant_ids=[planted.merchant], acquirer_store=store, drain_within=0.0
            )
        finally:
            await engine.dispose()

    without = asyncio.run(run(None))
    assert without.acquirer is None and not set(ACQUIRER_INVARIANTS) & set(without.failures)
    assert without.failed() == ["ledger_balanced"]  # no ledger entries were planted
    report = asyncio.run(run(planted.store))
    assert report.acquirer is not None
    assert report.failed() == ["ledger_balanced", "acquirer_one_0200_per_key"]
    assert twice in [v.key for v in report.violations]


# ---------------------------------------------------------------- idempay simulate, for real
@pytest.fixture(scope="module")
def database() -> Any:
    name = create_database("idempay_sim_acq")
    try:
        yield pg_url(name)
    finally:
        drop_database(name)


def _row(out: str, name: str) -> str:
    match = re.search(rf"^\W*{re.escape(name)}\s*\W+\s*(\S+)\s*\W*$", out, re.M)
    assert match, f"no row {name!r} in:\n{out}"
    return match.group(1)


def test_simulate_with_acquirer_faults_prints_the_acquirer_checks_and_they_hold(
    database: str, tmp_path: Path
) -> None:
    """A short fleet against a separate acquirer host that drops and delays answers past
    the link's 2 s timeout and cuts connections: keys go in doubt, their advices drain, and
    the acquirer's net approvals match the approved transactions."""
    env = {
        **os.environ,
        "IDEMPAY_DATABASE_URL": database,
        "IDEMPAY_VAR_DIR": str(tmp_path / "var"),
        "IDEMPAY_REDIS_URL": "",
        "IDEMPAY_ACQUIRER_TIMEOUT": "2",
        "COLUMNS": "120",
    }
    argv = [sys.executable, "-m", "idempay_tools", "simulate", "--workdir", str(tmp_path / "j")]
    argv += ["--terminals", "3", "--payments", "15", "--loss", "0.05", "--seed", "4"]
    argv += ["--acquirer-faults", "drop_answer=0.08,late_answer=0.08,drop_connection=0.04"]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "late_seconds=5.0" in out  # past the link's timeout, by default
    for name in ACQUIRER_INVARIANTS:
        assert _row(out, f"invariant {name}") == "ok", out
    assert 0 < int(_row(out, "acquirer: 0200s received")) <= 45  # one per key at most
    assert int(_row(out, "acquirer: answers withheld (dropped, cut)")) > 0
    assert int(_row(out, "declined acquirer_timeout (in doubt)")) > 0
    assert int(_row(out, "reversal advices queued")) >= int(
        _row(out, "declined acquirer_timeout (in doubt)")
    )
    assert _row(out, "acquirer: net approvals") == _row(out, "approved transactions")
    assert int(_row(out, "advice queue at the check")) == 0
    # Issue 32: the clearing files written from the store after the drain, landed and
    # reconciled (DuckDB reference): the in-doubt keys' approvals were reversed by their
    # advices, so 0 exceptions, and every approved transaction is matched.
    settled = re.search(
        r"settlement against the acquirer's clearing: (\d+) matched over \d+ days, "
        r"(\d+) exceptions — approved transactions (\d+)",
        out,
    )
    assert settled, out
    matched, exceptions, approved = map(int, settled.groups())
    assert exceptions == 0 and matched == approved == int(_row(out, "approved transactions"))
    for name in ("settlement_exceptions", "settlement_matched"):
        assert _row(out, f"invariant {name}") == "ok", out
    assert "all invariants hold" in out
    assert (tmp_path / "j" / "acquirer" / "acquirer.sqlite3").is_file()
