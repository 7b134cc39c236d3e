"""The report's "Offline selling" and "Duplicate guard" sections (issues 16, 17), from the
rows of ``offline_summary``, ``offline_terminals`` and ``duplicate_guard``."""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta
from html import escape
from typing import TYPE_CHECKING, Any

from analytics.charts import line_chart
from analytics.html_table import table
from analytics.metrics import FLEET

if TYPE_CHECKING:
    from analytics.report import AuditData

Rows = list[dict[str, Any]]
TOP_TERMINALS = 15
CANNOT_KNOW = (
    "The server sees an offline sale only when the terminal forwards it (an advice); a sale "
    "still stored in a terminal has left no trace on the server, so the audit cannot count "
    "what was stored but not forwarded at a day's end. It counts what it can: "
    "<em>forwarded after day end</em>, offline transactions the server processed on a later "
    "UTC day than the one they were sold on. Amounts at risk are the amounts of forwarded "
    "advices the issuer declined (the merchant's loss), in their currency."
)


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else 0.0


def _days(data: AuditData) -> list[str]:
    count = (data.end - data.start).days + 1
    return [(data.start + timedelta(days=i)).isoformat() for i in range(count)]


def fleet_offline_per_day(data: AuditData) -> Rows:
    """One row per day of the range: the fleet's counts over every currency, rates
    recomputed from them (0 on a day without transactions)."""
    sums: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for row in data.offline_summary:
        if row["merchant_id"] == FLEET:
            for name in ("transactions", "offline_transactions", "offline_declined"):
                sums[row["event_date"]][name] += row[name]
    return [
        {
            "event_date": day,
            "offline_rate": _ratio(sums[day]["offline_transactions"], sums[day]["transactions"]),
            "offline_decline_rate": _ratio(
                sums[day]["offline_declined"], sums[day]["offline_transactions"]
            ),
        }
        for day in _days(data)
    ]


def top_offline_terminals(data: AuditData) -> Rows:
    """Terminals by offline transactions over the range (per currency)."""
    sums: dict[tuple[str, str, str], dict[str, Any]] = {}
    for row in data.offline_terminals:
        key = (row["merchant_id"], row["terminal_id"] or "", row["currency"])
        total = sums.setdefault(
            key, {"offline": 0, "declined": 0, "at_risk": 0, "late": 0, "max": None}
        )
        total["offline"] += row["offline_transactions"]
        total["declined"] += row["offline_declined"]
        total["at_risk"] += row["offline_amount_at_risk"]
        total["late"] += row["forwarded_after_day_end"]
        longest = row["forward_delay_max_s"]
        if longest is not None and (total["max"] is None or longest > total["max"]):
            total["max"] = longest
    ranked = [
        {
            "merchant_id": merchant,
            "terminal_id": terminal,
            "currency": currency,
            "offline_transactions": t["offline"],
            "offline_declined": t["declined"],
            "offline_amount_at_risk": t["at_risk"],
            "forwarded_after_day_end": t["late"],
            "forward_delay_max_s": t["max"],
        }
        for (merchant, terminal, currency), t in sums.items()
    ]
    ranked.sort(
        key=lambda r: (
            -r["offline_transactions"],
            -r["offline_amount_at_risk"],
            r["merchant_id"],
            r["terminal_id"],
            r["currency"],
        )
    )
    return ranked[:TOP_TERMINALS]


def _notes(notes: Rows) -> str:
    if not notes:
        return ""
    items = "".join(
        f'<li class="lake-note">{escape(n["table"])} · {escape(n["event_date"] or "")} · '
        f"{escape(n['detail'])}</li>"
        for n in notes
    )
    return (
        '<div class="muted" id="lake-notes">Partitions older than the offline columns:'
        f"<ul>{items}</ul></div>"
    )


def offline_section(data: AuditData) -> str:
    days = fleet_offline_per_day(data)
    labels = [row["event_date"] for row in days]
    charts = "".join(
        line_chart(title, labels, [row[key] for row in days], synthesized=data.synthesized_days)
        for key, title in (
            ("offline_rate", "Offline rate per day"),
            ("offline_decline_rate", "Offline decline rate per day"),
        )
    )
    fleet = [row for row in data.offline_summary if row["merchant_id"] == FLEET]
    return (
        f'<p class="muted">{CANNOT_KNOW}</p>{_notes(data.lake_notes)}'
        f'<div class="charts" id="offline">{charts}</div>'
        + table(
            fleet,
            [
                ("event_date", "day", "day"),
                ("currency", "currency", "text"),
                ("transactions", "transactions", "num"),
                ("offline_transactions", "offline", "num"),
                ("offline_rate", "offline rate", "rate"),
                ("forward_delay_p50_s", "forward p50", "duration"),
                ("forward_delay_p95_s", "forward p95", "duration"),
                ("forward_delay_max_s", "forward max", "duration"),
                ("offline_declined", "declined", "num"),
                ("offline_decline_rate", "decline rate", "rate"),
                ("offline_amount_at_risk", "amount at risk", "money"),
                ("forwarded_after_day_end", "forwarded after day end", "num"),
            ],
            "No transactions in the range.",
            synthesized=data.synthesized_days,
            terms="offline",
        )
        + f"<h3>Terminals selling offline (top {TOP_TERMINALS})</h3>"
        + table(
            top_offline_terminals(data),
            [
                ("merchant_id", "merchant", "code"),
                ("terminal_id", "terminal", "text"),
                ("currency", "currency", "text"),
                ("offline_transactions", "offline", "num"),
                ("offline_declined", "declined", "num"),
                ("offline_amount_at_risk", "amount at risk", "money"),
                ("forwarded_after_day_end", "forwarded after day end", "num"),
                ("forward_delay_max_s", "forward max", "duration"),
            ],
            "No offline sale in the range.",
            terms="offline",
        )
    )


def duplicate_guard_section(data: AuditData) -> str:
    fleet = [row for row in data.duplicate_guard if row["merchant_id"] == FLEET]
    merchants: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for row in data.duplicate_guard:
        if row["merchant_id"] != FLEET:
            merchants[row["merchant_id"]][0] += row["duplicates_blocked"]
            merchants[row["merchant_id"]][1] += row["duplicates_overridden"]
    per_merchant = [
        {"merchant_id": m, "duplicates_blocked": b, "duplicates_overridden": o}
        for m, (b, o) in sorted(merchants.items(), key=lambda item: (-item[1][0], item[0]))
    ]
    day, merchant = ("event_date", "day", "day"), ("merchant_id", "merchant", "code")
    columns = [
        ("duplicates_blocked", "blocked (409 suspected_duplicate)", "num"),
        ("duplicates_overridden", "overridden by the cashier", "num"),
    ]
    return (
        '<p class="muted">Payments the guard answered 409 <code>suspected_duplicate</code> '
        "at the counter, and duplicates the cashier confirmed "
        '(<code>"allow_duplicate": true</code>; an overridden duplicate is still listed '
        "among the suspected double charges).</p>"
        + '<div id="duplicate-guard">'
        + table(fleet, [day, *columns], "No days.", synthesized=data.synthesized_days)
        + "</div>"
        + '<p class="muted">By merchant, over the range:</p>'
        + table(per_merchant, [merchant, *columns], "No block or override in the range.")
    )
