"""contract §8 on a lossy link: 2,000 payments from 20 concurrent terminals (each its own
``Client`` and journal) through the chaos proxy — request drops, response drops after the
server processed, and resets mixed — against the real server on Postgres."""

from __future__ import annotations

import asyncio
import io
import uuid
from collections import Counter
from pathlib import Path

import pytest
from integration_db import Merchant, journal_entries
from rich.console import Console

from api.db import create_engine
from idempay_tools.invariants import InvariantReport, check_invariants
from idempay_tools.simulate import FleetConfig, run_fleet
from tests.support.backend import Backend
from tests.support.services import Server

TERMINALS = 20
PAYMENTS_EACH = 100


@pytest.mark.parametrize("loss", [0.035, 0.20], ids=["loss-3.5pct", "loss-20pct"])
def test_every_payment_ends_definitive_and_is_processed_exactly_once(
    pg_backend: Backend, pg_server: Server, tmp_path: Path, loss: float
) -> None:
    merchant = Merchant.create(pg_backend, f"lossy-{uuid.uuid4().hex[:8]}")
    config = FleetConfig(
        base_url=pg_server.url,
        api_key=merchant.api_key,
        workdir=tmp_path,
        terminals=TERMINALS,
        payments=PAYMENTS_EACH,
        loss=loss,
        via_proxy=True,
        seed=int(loss * 1000),
        decline_share=0.05,
        base_backoff=0.01,
        max_backoff=0.2,
    )
    result = run_fleet(config, console=Console(file=io.StringIO()))

    # the link really was lossy, and the SDK really had to resolve doubt
    expected_faults = TERMINALS * PAYMENTS_EACH * loss * 0.4
    assert result.faults["drop_request"] > expected_faults / 4
    assert result.faults["drop_response"] > expected_faults / 4
    assert result.faults["reset_before"] + result.faults["reset_after"] > 0
    assert result.counts["lookups"] > 0 and result.counts["resends"] > 0

    # every payment ends definitive, in the SDK's answer and in every journal
    assert result.payments == TERMINALS * PAYMENTS_EACH
    tally = Counter(result.outcomes.values())
    assert set(tally) <= {"approved", "declined", "aborted"}, tally
    assert tally["approved"] > 0 and tally["declined"] > 0
    entries = [e for path in result.journals for e in journal_entries(path)]
    assert len(entries) == TERMINALS * PAYMENTS_EACH
    assert all(entry.state.is_terminal for entry in entries)

    # the server holds exactly one transaction per approved/declined payment, and no other
    held = merchant.transactions()
    processed = {k: s for k, s in result.outcomes.items() if s in ("approved", "declined")}
    assert held == processed
    # no key has two charges; every approval has its one charge
    charges = merchant.charges()
    assert all(n == 1 for n in charges.values())
    assert set(charges) == {k for k, s in processed.items() if s == "approved"}
    # no aborted key has a transaction; no key is left processing
    assert merchant.aborted_with_transaction() == []
    states = Counter(merchant.key_states().values())
    assert states["processing"] == 0

    report = asyncio.run(_invariants(pg_backend, merchant.id, result.outcomes, result.journals))
    assert report.ok, report.violations
    assert (report.duplicates, report.lost, report.journal_open) == (0, 0, 0)
    assert report.transactions == len(processed)


async def _invariants(
    backend: Backend, merchant_id: str, outcomes: dict[str, str], journals: list[Path]
) -> InvariantReport:
    engine = create_engine(backend.settings)
    try:
        return await check_invariants(
            engine, merchant_ids=[merchant_id], reported=outcomes, journals=journals
        )
    finally:
        await engine.dispose()
