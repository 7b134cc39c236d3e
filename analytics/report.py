"""``report.html``: the finance report, one self-contained file (contract §5).

Inline CSS and inline SVG charts (matplotlib's, ``analytics.charts``) only: no script, no
font, no image, no remote URL, so it opens offline exactly as it was written; its only
links are to the CSV files written beside it and to its own sections. The money leads:
every exactly-once violation is named in a red banner at the top with its day and
transaction id, then the money per currency in currency units (``analytics.report_money``:
approved, refunded, reversed, and the value at stake in suspects and settlement
exceptions), then the settlement reconciliation against the acquirer's clearing naming each
exception (``analytics.report_settlement``). Days the lake holds synthesized are said to be
(``analytics.manifest.synthesized_days``), and every term is defined at the end
(``analytics.report_definitions``).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import date
from html import escape
from typing import Any

from analytics import report_definitions
from analytics.charts import bar_chart, line_chart
from analytics.html_table import cell as _cell
from analytics.html_table import table as _table
from analytics.metrics import FLEET
from analytics.report_money import money_section, synthesized_note
from analytics.report_offline import duplicate_guard_section, offline_section
from analytics.report_settlement import settlement_section

Rows = list[dict[str, Any]]
TOP_TERMINALS = 15
MAX_SUSPECT_ROWS = 500
HEADLINE_COUNTS = [
    "transactions",
    "create_requests",
    "retried_transactions",
    "unseen_attempts",
    "duplicate_requests",
    "in_doubt_transactions",
    "key_reused",
    "aborted",
    "expired",
    "reversed",
    "acquirer_timeouts",
    "suspected_double_charges",
    "exactly_once_violations",
]
# The CSV files the audit writes beside report.html (analytics.jobs.daily_audit), linked.
CSV_FILES = [
    ("money_volume", "approved, refunded and reversed volume per day × merchant × currency"),
    ("daily_summary", "every metric per day × merchant, and the fleet (ALL)"),
    ("suspected_double_charges", "each suspected double charge, both transactions named"),
    ("exactly_once_violations", "each exactly-once violation (must be empty)"),
    ("settlement_recon", "matched and exceptions per day × merchant"),
    ("settlement_exceptions", "each settlement exception"),
    ("terminal_ranking", "terminals by retry rate per day × merchant"),
    ("network_rates", "the rates per day × network"),
    ("terminal_link_loss", "attempts received and unseen per day × terminal"),
    ("daily_trend", "the fleet's rates per day"),
    ("offline_summary", "offline selling per day × merchant × currency"),
    ("offline_terminals", "offline selling per terminal"),
    ("duplicate_guard", "the duplicate guard's blocks and overrides"),
    ("lake_warnings", "what is wrong with the lake this audit read"),
    ("lake_notes", "what changes a figure's meaning without being damage"),
]


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else 0.0


def _link_loss(unseen: float, received: float) -> float:
    return _ratio(unseen, unseen + received)


@dataclass
class AuditData:
    """The audit's tables as plain rows (dates as ISO strings), ready to render."""

    start: date
    end: date
    daily_summary: Rows = field(default_factory=list)
    terminal_ranking: Rows = field(default_factory=list)
    suspected_double_charges: Rows = field(default_factory=list)
    exactly_once_violations: Rows = field(default_factory=list)
    network_rates: Rows = field(default_factory=list)
    terminal_link_loss: Rows = field(default_factory=list)
    daily_trend: Rows = field(default_factory=list)
    offline_summary: Rows = field(default_factory=list)
    offline_terminals: Rows = field(default_factory=list)
    duplicate_guard: Rows = field(default_factory=list)
    settlement_recon: Rows = field(default_factory=list)
    settlement_exceptions: Rows = field(default_factory=list)
    lake_warnings: Rows = field(default_factory=list)
    lake_notes: Rows = field(default_factory=list)
    # None: the audit did not compute it (the report says so); [] : no money moved
    money_volume: Rows | None = None
    synthesized_days: list[str] = field(default_factory=list)  # ISO days

    def csv_files(self) -> list[tuple[str, str]]:
        """The CSV files written beside the report: (file name, what it holds)."""
        return [
            (f"{name}.csv", what)
            for name, what in CSV_FILES
            if name != "money_volume" or self.money_volume is not None
        ]

    @property
    def fleet_days(self) -> Rows:
        return [r for r in self.daily_summary if r["merchant_id"] == FLEET]

    def headline(self) -> dict[str, Any]:
        """Totals over the range, rates recomputed from the totals."""
        totals = {name: sum(r[name] for r in self.fleet_days) for name in HEADLINE_COUNTS}
        received = sum(r["received_attempts"] for r in self.terminal_link_loss)
        unseen = totals["unseen_attempts"]
        rates = {
            "retry_rate": _ratio(totals["retried_transactions"], totals["transactions"]),
            "link_loss_rate": _ratio(unseen, unseen + received),
            "duplicate_rate": _ratio(totals["duplicate_requests"], totals["create_requests"]),
            "in_doubt_rate": _ratio(totals["in_doubt_transactions"], totals["transactions"]),
            "acquirer_timeout_rate": _ratio(totals["acquirer_timeouts"], totals["transactions"]),
        }
        return {**totals, **rates, "settlement_exceptions": len(self.settlement_exceptions)}

    def networks(self) -> Rows:
        """Rates per network over the whole range (recomputed from counts)."""
        sums: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        counts = [
            "transactions",
            "retried_transactions",
            "create_requests",
            "duplicate_requests",
            "in_doubt_transactions",
        ]
        for row in self.network_rates:
            for name in counts:
                sums[row["network"]][name] += row[name]
        for row in self.terminal_link_loss:
            sums[row["network"]]["unseen_attempts"] += row["unseen_attempts"]
            sums[row["network"]]["received_attempts"] += row["received_attempts"]
        return [
            {
                "network": network,
                **{name: int(s[name]) for name in counts},
                "retry_rate": _ratio(s["retried_transactions"], s["transactions"]),
                "duplicate_rate": _ratio(s["duplicate_requests"], s["create_requests"]),
                "in_doubt_rate": _ratio(s["in_doubt_transactions"], s["transactions"]),
                "unseen_attempts": int(s["unseen_attempts"]),
                "link_loss_rate": _link_loss(s["unseen_attempts"], s["received_attempts"]),
            }
            for network, s in sorted(sums.items())
            if s["transactions"] or s["create_requests"]
        ]

    def flakiest_terminals(self) -> Rows:
        sums: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
        for row in self.terminal_ranking:
            total = sums[(row["merchant_id"], row["terminal_id"] or "")]
            total[0] += row["transactions"]
            total[1] += row["retried_transactions"]
        terminals: Rows = [
            {
                "merchant_id": merchant,
                "terminal_id": terminal,
                "transactions": t,
                "retried_transactions": r,
                "retry_rate": _ratio(r, t),
            }
            for (merchant, terminal), (t, r) in sums.items()
        ]
        terminals.sort(
            key=lambda row: (-row["retry_rate"], -row["retried_transactions"], row["terminal_id"])
        )
        return terminals[:TOP_TERMINALS]

    def lossiest_terminals(self) -> Rows:
        """Terminals by link loss over the range: attempts they sent that never arrived."""
        sums: dict[tuple[str, str], dict[str, Any]] = {}
        for row in self.terminal_link_loss:
            key = (row["merchant_id"], row["terminal_id"] or "")
            total = sums.setdefault(key, {"networks": set(), "received": 0, "unseen": 0})
            total["networks"].add(row["network"])
            total["received"] += row["received_attempts"]
            total["unseen"] += row["unseen_attempts"]
        ranked = sorted(
            (
                {
                    "merchant_id": merchant,
                    "terminal_id": terminal,
                    "network": ", ".join(sorted(t["networks"])),
                    "received_attempts": t["received"],
                    "unseen_attempts": t["unseen"],
                    "link_loss_rate": _link_loss(t["unseen"], t["received"]),
                }
                for (merchant, terminal), t in sums.items()
            ),
            key=lambda r: (-r["link_loss_rate"], -r["unseen_attempts"], r["terminal_id"]),
        )
        return ranked[:TOP_TERMINALS]


# ------------------------------------------------------------------------ HTML
CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;
max-width:1100px;color:#1d2330;padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px}
.muted{color:#667}.banner{padding:12px 16px;border-radius:6px;margin:16px 0;font-weight:600}
.banner.bad{background:#c62828;color:#fff}.banner.ok{background:#e8f5e9;color:#1b5e20}
.banner ul{margin:8px 0 0;font-weight:400}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(160px,1fr));gap:10px}
.card{border:1px solid #dde;border-radius:6px;padding:10px}
.card .v{font-size:20px;font-weight:650}.card .k{color:#667;font-size:12px}
table{border-collapse:collapse;width:100%;font-size:13px}
th,td{border-bottom:1px solid #e6e8ef;padding:4px 8px;text-align:right}
th:first-child,td:first-child,td.t{text-align:left}th{background:#f5f6fa}
td:not(.t){white-space:nowrap}
code{font-size:12px}
nav{margin:8px 0;font-size:13px}nav a{margin-right:10px}
a{color:#1565c0}a.term{color:inherit;text-decoration:underline dotted #99a}
.synth{display:inline-block;background:#eceff1;border:1px solid #b0bec5;border-radius:4px;
padding:0 5px;font-size:11px;font-weight:600;color:#455a64;vertical-align:1px}
.synth-note{background:#f5f7f9;border-left:4px solid #90a4ae;padding:8px 12px;margin:12px 0}
#money h3{margin:14px 0 6px;font-size:15px}
.currency .cards{grid-template-columns:repeat(auto-fill,minmax(200px,1fr))}
.card.money .v{font-size:18px;white-space:nowrap}
.card.bad{border-color:#c62828}.card.bad .v{color:#c62828}
figure.chart{margin:0;border:1px solid #eef;border-radius:6px;background:#fff;padding:4px}
details.chart-data{font-size:12px;margin:2px 6px 4px}details.chart-data table{width:auto}
.charts{display:flex;flex-wrap:wrap;gap:12px;margin:8px 0}
table.definitions th{text-align:left}table.definitions td{vertical-align:top}
table.definitions td:first-child{white-space:nowrap}
#files li{margin:2px 0}
"""


def _lake_banner(warnings: Rows) -> str:
    if not warnings:
        return ""
    items = "".join(
        f'<li class="lake-warning">{escape(w["kind"])} · {escape(w["table"])}'
        f"{' · ' + escape(w['event_date']) if w['event_date'] else ''} · "
        f"{escape(w['detail'])}</li>"
        for w in warnings
    )
    return (
        f'<div class="banner bad" id="lake-warnings">{len(warnings)} lake warning'
        f"{'s' if len(warnings) != 1 else ''}: the lake this audit read is damaged or "
        f"incomplete, so figures below may be wrong. Re-export before relying on them."
        f"<ul>{items}</ul></div>"
    )


def _banner(violations: Rows) -> str:
    if not violations:
        return '<div class="banner ok" id="exactly-once">0 exactly-once violations.</div>'
    items = "".join(
        f'<li class="violation">{escape(v["event_date"])} · merchant '
        f"<code>{escape(v['merchant_id'])}</code> · transaction "
        f"<code>{escape(v['transaction_id'])}</code> · {escape(v['violation'])} "
        f"({v['charge_entries']} charge entr{'y' if v['charge_entries'] == 1 else 'ies'})</li>"
        for v in violations
    )
    return (
        f'<div class="banner bad" id="exactly-once">{len(violations)} exactly-once '
        f"violation{'s' if len(violations) != 1 else ''}: money was charged more than once "
        f"or without a transaction. Investigate before settlement.<ul>{items}</ul></div>"
    )


def _cards(headline: dict[str, Any]) -> str:
    shown = [
        ("transactions", "transactions", "num"),
        ("create_requests", "create requests", "num"),
        ("retry_rate", "retry rate", "rate"),
        ("link_loss_rate", "link loss rate", "rate"),
        ("duplicate_rate", "duplicate rate", "rate"),
        ("in_doubt_rate", "in-doubt rate", "rate"),
        ("key_reused", "key reused (client bugs)", "num"),
        ("aborted", "aborted", "num"),
        ("reversed", "reversed", "num"),
        ("acquirer_timeout_rate", "acquirer timeout rate", "rate"),
        ("settlement_exceptions", "settlement exceptions", "num"),
        ("suspected_double_charges", "suspected double charges", "num"),
        ("exactly_once_violations", "exactly-once violations", "num"),
    ]
    return (
        '<div class="cards">'
        + "".join(
            f'<div class="card" data-metric="{key}"><div class="v">{_cell(headline[key], kind)}'
            f'</div><div class="k">{escape(label)}</div></div>'
            for key, label, kind in shown
        )
        + "</div>"
    )


def _trend_charts(data: AuditData) -> str:
    days = data.daily_trend or data.fleet_days
    labels = [row["event_date"] for row in days]
    charts = [
        line_chart(
            f"{title} per day",
            labels,
            [row[key] for row in days],
            synthesized=data.synthesized_days,
        )
        for key, title in (
            ("retry_rate", "Retry rate"),
            ("link_loss_rate", "Link loss"),
            ("duplicate_rate", "Duplicate rate"),
            ("in_doubt_rate", "In-doubt rate"),
            ("acquirer_timeout_rate", "Acquirer timeout rate"),
        )
    ]
    return f'<div class="charts" id="trend">{"".join(charts)}</div>'


def _network_section(data: AuditData) -> str:
    networks = data.networks()
    labels = [row["network"] for row in networks]
    chart = bar_chart(
        "Rates by network",
        labels,
        [
            ("retry", [row["retry_rate"] for row in networks]),
            ("duplicate", [row["duplicate_rate"] for row in networks]),
            ("in doubt", [row["in_doubt_rate"] for row in networks]),
        ],
    )
    table = _table(
        networks,
        [
            ("network", "network", "text"),
            ("transactions", "transactions", "num"),
            ("retry_rate", "retry rate", "rate"),
            ("create_requests", "create requests", "num"),
            ("duplicate_rate", "duplicate rate", "rate"),
            ("in_doubt_rate", "in-doubt rate", "rate"),
            ("unseen_attempts", "unseen attempts", "num"),
            ("link_loss_rate", "link loss", "rate"),
        ],
        "No traffic in the range.",
    )
    loss = bar_chart(
        "Link loss by network (attempts sent that never reached the server)",
        labels,
        [("link loss", [row["link_loss_rate"] for row in networks])],
    )
    return (
        f'<div class="charts" id="networks">{chart}</div>'
        f'<div class="charts" id="link-loss">{loss}</div>{table}'
    )


NAV = [
    ("money", "Money"),
    ("settlement", "Settlement"),
    ("headline", "Headline"),
    ("trend", "Daily trend"),
    ("networks", "By network"),
    ("offline", "Offline selling"),
    ("suspects", "Suspected double charges"),
    ("fleet-per-day", "Fleet per day"),
    ("definitions", "Definitions"),
    ("files", "Data files"),
]


def _nav() -> str:
    return "<nav>" + "".join(f'<a href="#{a}">{escape(t)}</a>' for a, t in NAV) + "</nav>"


def _files(data: AuditData) -> str:
    items = "".join(
        f'<li><a href="{escape(name)}">{escape(name)}</a> — {escape(what)}</li>'
        for name, what in data.csv_files()
    )
    return (
        '<p class="muted">Written beside this report (each also as a Parquet folder of the '
        "same name). Text cells a spreadsheet would run as a formula start with "
        f'<code>\'</code>.</p><ul id="files">{items}</ul>'
    )


def _csv(name: str) -> str:
    return f'<a href="{name}.csv">{name}.csv</a>'


def render(data: AuditData) -> str:
    headline = data.headline()
    suspects = data.suspected_double_charges
    shown_suspects = suspects[:MAX_SUSPECT_ROWS]
    more = len(suspects) - len(shown_suspects)
    synthesized = data.synthesized_days
    sections = [
        "<h1>idempay — finance report</h1>",
        f'<p class="muted">{data.start.isoformat()} to {data.end.isoformat()} (UTC, '
        "inclusive). Amounts in currency units. Event metrics count on the event's day; key "
        "metrics on the day of the key's first event.</p>",
        synthesized_note(data),
        _nav(),
        _lake_banner(data.lake_warnings),
        _banner(data.exactly_once_violations),
        "<h2>Money</h2>",
        money_section(data),
        "<h2>Settlement against the acquirer's clearing</h2>",
        settlement_section(data),
        '<a id="headline"></a><h2>Headline</h2>',
        _cards(headline),
        "<h2>Daily trend</h2>",
        _trend_charts(data),
        "<h2>By network</h2>",
        _network_section(data),
        f"<h2>Flakiest terminals (top {TOP_TERMINALS} by retry rate)</h2>",
        _table(
            data.flakiest_terminals(),
            [
                ("merchant_id", "merchant", "code"),
                ("terminal_id", "terminal", "text"),
                ("transactions", "transactions", "num"),
                ("retried_transactions", "retried", "num"),
                ("retry_rate", "retry rate", "rate"),
            ],
            "No transactions in the range.",
        ),
        f"<h2>Lossiest links (top {TOP_TERMINALS} terminals by link loss)</h2>",
        '<p class="muted">Attempts the terminal numbered but the server never received '
        "(lost on the way), over the range.</p>",
        _table(
            data.lossiest_terminals(),
            [
                ("merchant_id", "merchant", "code"),
                ("terminal_id", "terminal", "text"),
                ("network", "network", "text"),
                ("received_attempts", "attempts received", "num"),
                ("unseen_attempts", "unseen attempts", "num"),
                ("link_loss_rate", "link loss", "rate"),
            ],
            "No numbered attempts in the range.",
        ),
        "<h2>Offline selling</h2>",
        offline_section(data),
        "<h2>Duplicate guard</h2>",
        duplicate_guard_section(data),
        f'<h2 id="suspects">Suspected double charges ({len(suspects)})</h2>',
        '<p class="muted">Approved purchases, same merchant, terminal, card, amount and '
        "currency, ≤ 120 s apart under different keys: a client minted a new key. All of "
        f"them in {_csv('suspected_double_charges')}.</p>",
        _table(
            shown_suspects,
            [
                ("event_date", "day", "day"),
                ("merchant_id", "merchant", "code"),
                ("terminal_id", "terminal", "text"),
                ("amount", "amount", "money"),
                ("first_transaction_id", "first", "code"),
                ("second_transaction_id", "second", "code"),
                ("seconds_apart", "seconds apart", "num"),
            ],
            "None.",
            synthesized=synthesized,
        ),
        f'<p class="muted">… and {more} more in suspected_double_charges.csv.</p>'
        if more > 0
        else "",
        '<h2 id="fleet-per-day">Fleet per day</h2>',
        _table(
            data.fleet_days,
            [
                ("event_date", "day", "day"),
                ("transactions", "transactions", "num"),
                ("create_requests", "creates", "num"),
                ("retry_rate", "retry", "rate"),
                ("link_loss_rate", "link loss", "rate"),
                ("duplicate_rate", "duplicate", "rate"),
                ("in_doubt_rate", "in doubt", "rate"),
                ("lookup_found_rate", "lookup found", "rate"),
                ("in_doubt_resolution_p95_s", "resolution p95", "duration"),
                ("create_p95_ms", "create p95 ms", "num"),
                ("suspected_double_charges", "suspects", "num"),
                ("exactly_once_violations", "violations", "num"),
            ],
            "No days.",
            synthesized=synthesized,
            terms="audit",
        ),
        "<h2>Definitions</h2>",
        report_definitions.section(),
        "<h2>Data files</h2>",
        _files(data),
    ]
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>idempay finance report {data.start.isoformat()} – {data.end.isoformat()}"
        f"</title><style>{CSS}</style></head><body>{''.join(sections)}</body></html>\n"
    )
