"""The report's settlement section: the money first (contract §5).

A banner says whether every sale matches the acquirer's clearing file; then each exception
one by one (kind, day, merchant, rrn, transaction, our amount, the clearing's amount), the
matched and exception counts per day as a chart, and the per-day table. Amounts are in
currency units, signed as they move money (refunds negative); the matched amount, summed
over currencies by the audit, is in currency units when the range has one currency.
"""

from __future__ import annotations

from collections import defaultdict
from html import escape
from typing import TYPE_CHECKING, Any

from analytics.charts import bar_chart
from analytics.html_table import money
from analytics.html_table import table as _table
from analytics.metrics import EXCEPTION_KINDS, FLEET
from analytics.report_definitions import SETTLEMENT_KINDS, anchor, to_html
from analytics.report_money import currencies, exception_at_stake

if TYPE_CHECKING:
    from analytics.report import AuditData

MAX_EXCEPTION_ROWS = 500


def _money(value: Any, currency: Any = None) -> str:
    return money(value, str(currency) if currency else None)


def _one_currency(data: AuditData) -> str | None:
    found = currencies(data)
    return found[0] if len(found) == 1 and found[0] else None


def _exception_items(rows: list[dict[str, Any]]) -> str:
    return "".join(
        f'<li class="settlement-exception" data-kind="{escape(r["kind"])}">'
        f"<b>{escape(r['kind'])}</b> · {escape(r['event_date'])} · merchant "
        f"<code>{escape(r['merchant_id'])}</code> · rrn <code>{escape(r['rrn'])}</code> · "
        f"transaction <code>{escape(r['transaction_id'] or '–')}</code> · ours "
        f"{_money(r['amount'], r['currency'])} · clearing "
        f"{_money(r['clearing_amount'], r['currency'])} · at stake "
        f"{_money(exception_at_stake(r), r['currency'])}</li>"
        for r in rows
    )


def _banner(data: AuditData) -> str:
    fleet = [r for r in data.settlement_recon if r["merchant_id"] == FLEET]
    exceptions = data.settlement_exceptions
    if not fleet and not exceptions:
        return (
            '<div class="banner" id="settlement">No clearing file in the lake for this range:'
            " nothing reconciled (idempay lake add-clearing FILE --lake DIR).</div>"
        )
    matched = sum(r["matched"] for r in fleet)
    amount = sum(r["matched_amount"] for r in fleet)
    if not exceptions:
        return (
            f'<div class="banner ok" id="settlement">Every sale matches the acquirer\'s '
            f"clearing: {matched:,} matched ({_money(amount, _one_currency(data))}), 0 exceptions "
            f"over {len(fleet)} clearing day{'s' if len(fleet) != 1 else ''}.</div>"
        )
    shown = exceptions[:MAX_EXCEPTION_ROWS]
    more = len(exceptions) - len(shown)
    tail = f"<p>… and {more} more in settlement_exceptions.csv.</p>" if more > 0 else ""
    return (
        f'<div class="banner bad" id="settlement">{len(exceptions)} settlement exception'
        f"{'s' if len(exceptions) != 1 else ''} against the acquirer's clearing "
        f"({matched:,} matched). Resolve before settlement.<ul>{_exception_items(shown)}</ul>"
        f"{tail}</div>"
    )


def _chart(data: AuditData) -> str:
    per_day: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for row in data.settlement_recon:
        if row["merchant_id"] == FLEET:
            per_day[row["event_date"]]["matched"] += row["matched"]
            per_day[row["event_date"]]["exceptions"] += sum(row[k] for k in EXCEPTION_KINDS)
    days = sorted(per_day)
    if not days:
        return ""
    chart = bar_chart(
        "Matched vs exceptions per day",
        days,
        [
            ("matched", [per_day[d]["matched"] for d in days]),
            ("exceptions", [per_day[d]["exceptions"] for d in days]),
        ],
        unit="count",
        synthesized=data.synthesized_days,
    )
    return f'<div class="charts" id="settlement-chart">{chart}</div>'


def settlement_section(data: AuditData) -> str:
    legend = "".join(
        f'<li><a class="term" href="#{anchor(kind, "settlement")}"><b>{escape(kind)}</b></a>: '
        f"{to_html(text)}</li>"
        for kind, text in SETTLEMENT_KINDS
        if kind != "matched"
    )
    one = _one_currency(data)
    rows = [{**r, "currency": one} for r in data.settlement_recon if r["merchant_id"] == FLEET]
    table = _table(
        rows,
        [
            ("event_date", "day", "day"),
            ("matched", "matched", "num"),
            (
                "matched_amount",
                "matched amount" if one else "matched amount (minor units)",
                "money" if one else "num",
            ),
            ("acquirer_only", "acquirer only", "num"),
            ("ours_only", "ours only", "num"),
            ("amount_mismatch", "amount mismatch", "num"),
            ("duplicate_rrn", "duplicate rrn", "num"),
        ],
        "No clearing day in the range.",
        synthesized=data.synthesized_days,
        terms="settlement",
    )
    return (
        f"{_banner(data)}"
        '<p class="muted">Our transactions against the acquirer\'s clearing files, matched '
        "by rrn whatever the day (a sale approved at the acquirer before midnight and "
        "finished here after it is one match). Matched, ours_only and amount_mismatch count "
        "on the transaction's day; acquirer_only and duplicate_rrn on the clearing row's. "
        "Amounts in currency units, refunds negative; all of them in "
        '<a href="settlement_recon.csv">settlement_recon.csv</a> and '
        '<a href="settlement_exceptions.csv">settlement_exceptions.csv</a>.</p>'
        f'<ul class="muted">{legend}</ul>'
        f"{_chart(data)}{table}"
    )
