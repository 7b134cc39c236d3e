"""The report's first section: the money, per currency, in currency units.

Approved, refunded and reversed volume (``money_volume``, ``analytics.money``), the net,
and the value at stake in the suspected double charges and in the settlement exceptions
(computed here from the audit's rows: ``analytics.report_definitions`` says how). Never
summed across currencies. Also the label that says which days are synthesized.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import date, timedelta
from html import escape
from typing import TYPE_CHECKING, Any

from analytics.charts import bar_chart
from analytics.html_table import SYNTH_BADGE, money, table
from analytics.metrics import FLEET
from analytics.report_definitions import anchor

if TYPE_CHECKING:
    from analytics.report import AuditData

Rows = list[dict[str, Any]]
NO_CURRENCY = ""
VOLUME = [
    ("approved_purchases", "approved_amount"),
    ("refunds", "refunded_amount"),
    ("reversed_transactions", "reversed_amount"),
]


def exception_at_stake(row: dict[str, Any]) -> int:
    """The money one settlement exception puts in question (minor units, ≥ 0)."""
    ours: int = row["amount"] or 0
    theirs: int = row["clearing_amount"] or 0
    kind = row["kind"]
    if kind == "ours_only":
        return abs(ours)
    if kind == "acquirer_only":
        return abs(theirs)
    if kind == "amount_mismatch":
        return abs(ours - theirs)
    return abs(theirs - ours)  # duplicate_rrn: the clearing's net amount beyond ours


def currencies(data: AuditData) -> list[str]:
    """Every currency the range has money in (transactions, suspects, exceptions)."""
    found = {r["currency"] for r in data.money_volume or [] if r["merchant_id"] == FLEET}
    found |= {r["currency"] for r in data.offline_summary if r["merchant_id"] == FLEET}
    found |= {r["currency"] for r in data.suspected_double_charges}
    found |= {r["currency"] or NO_CURRENCY for r in data.settlement_exceptions}
    return sorted(c for c in found if c is not None)


def totals(data: AuditData) -> dict[str, dict[str, int]]:
    """Per currency over the range: the volume's counts and amounts, ``net_amount``,
    ``suspects`` and ``suspects_at_stake``, ``exceptions`` and ``exceptions_at_stake``."""
    sums: dict[str, dict[str, int]] = {c: defaultdict(int) for c in currencies(data)}
    for row in data.money_volume or []:
        if row["merchant_id"] == FLEET:
            for number, amount in VOLUME:
                sums[row["currency"]][number] += row[number]
                sums[row["currency"]][amount] += row[amount]
    for row in data.suspected_double_charges:
        sums[row["currency"]]["suspects"] += 1
        sums[row["currency"]]["suspects_at_stake"] += abs(row["amount"])
    for row in data.settlement_exceptions:
        sums[row["currency"] or NO_CURRENCY]["exceptions"] += 1
        sums[row["currency"] or NO_CURRENCY]["exceptions_at_stake"] += exception_at_stake(row)
    for total in sums.values():
        total["net_amount"] = total["approved_amount"] - total["refunded_amount"]
    return {c: dict(t) for c, t in sums.items()}


def _plural(n: int, one: str, many: str) -> str:
    return f"{n:,} {one if n == 1 else many}"


def _card(currency: str, metric: str, label: str, value: int | None, note: str, bad: bool) -> str:
    shown = "–" if value is None else money(value, currency or None)
    return (
        f'<div class="card money{" bad" if bad else ""}" data-currency="{escape(currency)}" '
        f'data-metric="{metric}" data-value="{"" if value is None else value}">'
        f'<div class="v">{shown}</div><div class="k"><a class="term" '
        f'href="#{anchor(metric, "money")}">{escape(label)}</a> · {escape(note)}</div></div>'
    )


def _cards(currency: str, t: dict[str, int], computed: bool) -> str:
    def volume(metric: str) -> int | None:
        return t.get(metric, 0) if computed else None

    suspects, exceptions = t.get("suspects", 0), t.get("exceptions", 0)
    cards = [
        _card(currency, "approved_amount", "approved", volume("approved_amount"),
              _plural(t.get("approved_purchases", 0), "purchase", "purchases"), False),
        _card(currency, "refunded_amount", "refunded", volume("refunded_amount"),
              _plural(t.get("refunds", 0), "refund", "refunds"), False),
        _card(currency, "reversed_amount", "reversed", volume("reversed_amount"),
              _plural(t.get("reversed_transactions", 0), "transaction", "transactions"), False),
        _card(currency, "net_amount", "net", volume("net_amount"),
              "approved − refunded", False),
        _card(currency, "suspects_at_stake", "at stake in suspected double charges",
              t.get("suspects_at_stake", 0), _plural(suspects, "suspect", "suspects"),
              suspects > 0),
        _card(currency, "exceptions_at_stake", "at stake in settlement exceptions",
              t.get("exceptions_at_stake", 0),
              _plural(exceptions, "exception", "exceptions"), exceptions > 0),
    ]  # fmt: skip
    title = escape(currency) if currency else "no currency (clearing rows without one)"
    return (
        f'<div class="currency" data-currency="{escape(currency)}"><h3>{title}</h3>'
        f'<div class="cards">{"".join(cards)}</div></div>'
    )


def per_day(data: AuditData) -> Rows:
    """One row per day × currency: the fleet's volume and the suspects' value at stake."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}

    def row(day: str, currency: str) -> dict[str, Any]:
        blank = {"event_date": day, "currency": currency, "suspects": 0, "suspects_at_stake": 0}
        for number, amount in VOLUME:
            blank[number], blank[amount] = 0, 0
        return rows.setdefault((day, currency), blank)

    for r in data.money_volume or []:
        if r["merchant_id"] == FLEET:
            target = row(r["event_date"], r["currency"])
            for number, amount in VOLUME:
                target[number] += r[number]
                target[amount] += r[amount]
    for r in data.suspected_double_charges:
        target = row(r["event_date"], r["currency"])
        target["suspects"] += 1
        target["suspects_at_stake"] += abs(r["amount"])
    return [rows[k] for k in sorted(rows)]


def _chart(data: AuditData, days: Rows) -> str:
    labels = _range(data.start, data.end)
    charts = []
    for currency in sorted({r["currency"] for r in days}):
        mine = {r["event_date"]: r for r in days if r["currency"] == currency}
        charts.append(
            bar_chart(
                f"Approved, refunded and reversed per day ({currency})",
                labels,
                [
                    (name, [mine[d][key] if d in mine else 0 for d in labels])
                    for name, key in (
                        ("approved", "approved_amount"),
                        ("refunded", "refunded_amount"),
                        ("reversed", "reversed_amount"),
                    )
                ],
                unit=currency,
                synthesized=data.synthesized_days,
                wide=False,
            )
        )
    return f'<div class="charts" id="money-chart">{"".join(charts)}</div>' if charts else ""


def _range(start: date, end: date) -> list[str]:
    return [(start + timedelta(days=i)).isoformat() for i in range((end - start).days + 1)]


def _spans(days: Iterable[str]) -> str:
    """Consecutive days as ranges: 2026-11-14 – 2026-11-19, 2026-11-21."""
    ordered = sorted(date.fromisoformat(d) for d in days)
    runs: list[list[date]] = []
    for day in ordered:
        if runs and runs[-1][-1] + timedelta(days=1) == day:
            runs[-1].append(day)
        else:
            runs.append([day])
    return ", ".join(
        r[0].isoformat() if len(r) == 1 else f"{r[0].isoformat()} – {r[-1].isoformat()}"
        for r in runs
    )


def synthesized_note(data: AuditData) -> str:
    """The label that says which days of the range are synthesized (empty when none)."""
    days = _range(data.start, data.end)
    made_up = [d for d in days if d in set(data.synthesized_days)]
    if not made_up:
        return ""
    real = [d for d in days if d not in set(made_up)]
    tail = f" Real traffic: {_spans(real)}." if real else " No day of the range is real traffic."
    return (
        f'<p class="synth-note" id="synthesized">{SYNTH_BADGE} {len(made_up)} of {len(days)} '
        f"day{'s' if len(days) != 1 else ''} {'are' if len(made_up) != 1 else 'is'} "
        f"synthesized — made up by <code>analytics.synth</code>, not the server's traffic: "
        f"{_spans(made_up)}.{tail} Compare the real day with them as with a model, not as "
        f'with history (<a class="term" href="#{anchor("synthesized", "money")}">'
        "definition</a>).</p>"
    )


def money_section(data: AuditData) -> str:
    sums = totals(data)
    computed = data.money_volume is not None
    missing = (
        ""
        if computed
        else '<p class="muted" id="no-money-volume">This audit did not compute the approved, '
        "refunded and reversed volume (money_volume): only the values at stake are shown.</p>"
    )
    if not sums:
        nothing = '<p class="muted">No money moved in the range.</p>'
        return f'<section id="money">{missing}{nothing}</section>'
    days = per_day(data)
    volume = [
        ("approved_purchases", "approved", "num"),
        ("approved_amount", "approved volume", "money"),
        ("refunds", "refunds", "num"),
        ("refunded_amount", "refunded volume", "money"),
        ("reversed_transactions", "reversed", "num"),
        ("reversed_amount", "reversed volume", "money"),
    ]
    columns = [
        ("event_date", "day", "day"),
        ("currency", "currency", "text"),
        *(volume if computed else []),
        ("suspects", "suspected double charges", "num"),
        ("suspects_at_stake", "at stake", "money"),
    ]
    return (
        '<section id="money">'
        + missing
        + "".join(_cards(c, t, computed) for c, t in sums.items())
        + (_chart(data, days) if computed else "")
        + table(days, columns, "No day with money.", synthesized=data.synthesized_days)
        + "</section>"
    )
