"""The report's definitions are the contract's: one copy in code
(``analytics.report_definitions``), checked here word for word against docs/contract.md's
metric tables, and by name against the audit's CSV columns (``analytics.metrics``, the
product specification's metric names in its order). A definition changed on one side only
fails here."""

from __future__ import annotations

from pathlib import Path

from analytics.metrics import METRIC_COLUMNS, OFFLINE_METRICS
from analytics.money import MONEY_COLUMNS
from analytics.report_definitions import (
    AUDIT_METRICS,
    MONEY_TERMS,
    OFFLINE_COLUMNS,
    SETTLEMENT_KINDS,
    names,
    section,
)

CONTRACT = Path(__file__).resolve().parents[2] / "docs" / "contract.md"


def _table(heading: str) -> list[tuple[str, str]]:
    """The first Markdown table after ``heading`` in docs/contract.md, as (name, text)."""
    part = CONTRACT.read_text(encoding="utf-8").split(heading, 1)[1]
    rows: list[tuple[str, str]] = []
    for line in part.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            rows.append((cells[0], cells[1]))
        elif rows:
            break
    return rows[2:]  # the header and its rule


def test_the_audit_metrics_are_the_contracts_table() -> None:
    assert _table("### §5.2 Daily audit") == AUDIT_METRICS


def test_the_offline_columns_are_the_contracts_table() -> None:
    assert _table("### §5.3 Offline selling") == OFFLINE_COLUMNS


def test_every_column_the_audit_writes_is_defined() -> None:
    assert [n for term, _ in AUDIT_METRICS for n in names(term)] == METRIC_COLUMNS
    assert [n for term, _ in OFFLINE_COLUMNS for n in names(term)] == OFFLINE_METRICS
    money = {n for term, _ in MONEY_TERMS for n in names(term)}
    assert {c for c in MONEY_COLUMNS if c.endswith("_amount")} <= money
    kinds = [k for k, _ in SETTLEMENT_KINDS]
    assert kinds == ["matched", "acquirer_only", "ours_only", "amount_mismatch", "duplicate_rrn"]


def test_the_section_renders_each_term_once_with_its_anchor() -> None:
    html = section()
    assert html.count('id="def-audit-lookup_found_rate"') == 1
    assert 'id="def-offline-forward_delay_max_s"' in html
    assert "<code>attempt</code> ≥ 2" in html  # the contract's code spans, as HTML
