"""The link-loss check of ``idempay simulate`` and ``idempay demo``
(``idempay_tools.simulate_links``): the proxy's tally per key, the audit's figures for one
merchant, and the verdict — including the disagreements it must fail on."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from idempay_tools.simulate_links import (
    LinkLedger,
    LinkLossCheck,
    LinkTally,
    audit_figures,
    check_link_loss,
    render_link_check,
)

CREATE = "POST /v1/transactions HTTP/1.1"
K1, K2, K3 = "AAAA-1", "bbbb-2", "cccc-3"


def _creates(ledger: LinkLedger, key: str, *fates: str) -> None:
    for attempt, fate in enumerate(fates, start=1):
        headers = {"idempotency-key": key, "idempotency-attempt": str(attempt)}
        ledger.observe(CREATE, headers, fate)


def _ledger() -> LinkLedger:
    """K1: lost twice, then through. K2: answer lost, then a lookup. K3 (aborted in the
    outcomes below): lost, unsure."""
    ledger = LinkLedger()
    _creates(ledger, K1, "drop_request", "reset_before", "passed")
    _creates(ledger, K2, "drop_response")
    ledger.observe(f"GET /v1/transactions/{K2} HTTP/1.1", {"idempotency-key": K2}, "drop_request")
    _creates(ledger, K3, "reset_before", "upstream_errors")
    return ledger


def _audit_out(tmp: Path, *, unseen: int, received: int) -> Path:
    """daily_summary and terminal_link_loss Parquet folders: the fleet's merchant on two days
    (its figures split across them), another merchant, and the fleet row."""
    days = ["2026-11-23", "2026-11-24"]
    summary = {
        "event_date": [*days, days[1], days[1]],
        "merchant_id": ["mer_fleet", "mer_fleet", "mer_other", "ALL"],
        "unseen_attempts": [unseen - 1, 1, 50, unseen + 50],
    }
    links = {
        "merchant_id": ["mer_fleet", "mer_fleet", "mer_other"],
        "terminal_id": ["SIM-0000", "SIM-0001", "T-9"],
        "received_attempts": [received - 1, 1, 700],
    }
    for name, columns in (("daily_summary", summary), ("terminal_link_loss", links)):
        (tmp / name).mkdir(parents=True)
        pq.write_table(pa.table(columns), tmp / name / "part-0.parquet")
    return tmp


def test_the_ledger_tallies_creates_by_fate_per_key() -> None:
    mine, others = _ledger().split([K1.lower(), K2.upper()])
    assert mine == LinkTally(lost=2, forwarded=2, answer_lost=1, unsure=0)
    assert others == LinkTally(lost=1, forwarded=0, answer_lost=0, unsure=1)
    assert mine.rate == 0.5


def test_audit_figures_are_the_merchant_s_over_every_day(tmp_path: Path) -> None:
    out = _audit_out(tmp_path, unseen=7, received=40)
    assert audit_figures(out, "mer_fleet") == (7, 40)
    assert audit_figures(out, "mer_nobody") == (0, 0)


def test_the_audit_agrees_when_it_counts_what_the_proxy_lost(tmp_path: Path) -> None:
    outcomes = {K1.lower(): "approved", K2.lower(): "declined", K3.lower(): "aborted"}
    out = _audit_out(tmp_path, unseen=2, received=2)
    check = check_link_loss(_ledger(), outcomes, audit_out=out, merchant_id="mer_fleet")
    assert (check.proxy.lost, check.lost_elsewhere, check.unseen, check.received) == (2, 1, 2, 2)
    assert check.ok and check.audit_rate == 0.5
    assert "link loss: agree" in render_link_check(check)


def test_it_tolerates_no_more_than_the_creates_dropped_after_forwarding() -> None:
    proxy = LinkTally(lost=10, forwarded=500, answer_lost=3, unsure=1)
    verdicts = {unseen: LinkLossCheck(proxy, 0, unseen, 500).ok for unseen in range(0, 20)}
    assert [unseen for unseen, ok in verdicts.items() if ok] == [10, 11, 12, 13, 14]


def test_it_fails_when_the_audit_misses_lost_attempts(tmp_path: Path) -> None:
    """The bug of issue 19: the audit saw 0 % while the terminals had resent."""
    outcomes = {K1.lower(): "approved", K2.lower(): "approved"}
    out = _audit_out(tmp_path, unseen=0, received=2)
    check = check_link_loss(_ledger(), outcomes, audit_out=out, merchant_id="mer_fleet")
    assert not check.ok
    assert "DISAGREE: unseen should be in [2, 3]" in render_link_check(check)
