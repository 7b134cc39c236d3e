"""The report's definitions: the contract's metric tables (docs/contract.md §5.2 and §5.3)
as data, plus the terms the report itself adds (the money, the settlement's kinds, a
synthesized day). One copy: ``tests/analytics/test_report_definitions.py`` checks the
contract's tables against these, word for word, and every metric name of the product
specification and of ``analytics.metrics`` against the names here — a definition changed
on one side only fails the suite.

Definitions are the contract's Markdown (``code`` spans only); ``to_html`` renders them.
"""

from __future__ import annotations

import re
from html import escape

Terms = list[tuple[str, str]]

# docs/contract.md §5.2, the daily audit's metric table (daily_summary.csv), in order.
AUDIT_METRICS: Terms = [
    ("transactions", "keys with a create event of outcome created"),
    ("create_requests", "create events, every outcome"),
    (
        "retried_transactions",
        "keys counted in transactions whose create events other than key_reused number ≥ 2, "
        "or include one with `attempt` ≥ 2",
    ),
    ("retry_rate", "retried_transactions ÷ transactions"),
    (
        "unseen_attempts",
        "over keys counted in transactions, their non-key_reused create events carrying an "
        "`attempt`: Σ max(0, highest attempt − number of such events)",
    ),
    ("link_loss_rate", "unseen_attempts ÷ (unseen_attempts + the number of such events)"),
    ("duplicate_requests", "create events of outcome replayed or in_progress"),
    ("duplicate_rate", "duplicate_requests ÷ create_requests"),
    ("in_doubt_transactions", "keys counted in transactions with at least one lookup event"),
    ("in_doubt_rate", "in_doubt_transactions ÷ transactions"),
    ("lookup_found_rate", "lookup events found ÷ lookup events found or not_found"),
    (
        "in_doubt_resolution_p50_s",
        "median, over in-doubt transactions, of the seconds from the key's first create event "
        "to the first event at or after its first lookup whose outcome is found, created, "
        "replayed, aborted or fenced",
    ),
    ("in_doubt_resolution_p95_s", "the same, 95th percentile"),
    ("key_reused", "create events of outcome key_reused"),
    ("aborted", "keys with an abort event of outcome aborted"),
    ("expired", "keys with a create event of outcome expired"),
    ("reversed", "keys with a reversal event of outcome reversed"),
    (
        "acquirer_timeouts",
        "transactions declined with `decline_reason` acquirer_timeout (their authorization "
        "reversed by advice, §2.9), on the transaction's date",
    ),
    ("acquirer_timeout_rate", "acquirer_timeouts ÷ transactions"),
    (
        "suspected_double_charges",
        "approved purchases grouped by merchant, terminal, card_fingerprint, amount, currency, "
        "ordered by created_at: each consecutive pair ≤ 120 s apart under different keys, "
        "counted on the later one's date",
    ),
    (
        "exactly_once_violations",
        "transactions with more than one charge entry, plus charge entries without a "
        "transaction; must be 0",
    ),
    ("create_p50_ms", "latency percentile over the day's create events"),
    ("create_p95_ms", "the same, 95th"),
    ("create_p99_ms", "the same, 99th"),
]

# docs/contract.md §5.3, offline_summary.csv's columns, in order (one row names three).
OFFLINE_COLUMNS: Terms = [
    ("transactions", "transactions of the day (the `transactions` table)"),
    ("offline_transactions", "those with `offline` true"),
    ("offline_rate", "offline_transactions ÷ transactions"),
    (
        "forward_delay_p50_s, _p95_s, _max_s",
        "over offline transactions with a `captured_at`: created_at − captured_at in seconds "
        "(exact, linear interpolation; null when none)",
    ),
    ("offline_declined", "offline transactions with status declined (the merchant's loss)"),
    ("offline_decline_rate", "offline_declined ÷ offline_transactions"),
    ("offline_amount_at_risk", "Σ amount of offline_declined, in the row's currency"),
    (
        "forwarded_after_day_end",
        "offline transactions whose captured_at UTC date is before their created_at date",
    ),
]

# The settlement reconciliation's kinds (docs/contract.md §5.4).
SETTLEMENT_KINDS: Terms = [
    ("matched", "an approved transaction with an unreversed clearing row of the same amount "
     "and currency (matched by `rrn`)"),
    ("acquirer_only", "an unreversed clearing row with no approved transaction of ours: a "
     "customer charged without a sale"),
    ("ours_only", "an approved transaction with no unreversed clearing row: a sale not paid"),
    ("amount_mismatch", "matched by `rrn`, but the amount or currency differs"),
    ("duplicate_rrn", "more than one clearing row for one `rrn`"),
]  # fmt: skip

# The report's own terms: money_volume.csv (``analytics.money.money_volume``) and the
# values at stake the report computes from the audit's rows.
MONEY_TERMS: Terms = [
    ("approved_amount", "Σ amount of purchases whose status is approved (a reversed one is "
     "not), on the transaction's `created_at` date, per currency (`approved_purchases`: "
     "their number)"),
    ("refunded_amount", "Σ amount of refunds whose status is approved (`refunds`: their "
     "number)"),
    ("reversed_amount", "Σ amount of transactions approved, then undone by a reversal "
     "(status reversed; `reversed_transactions`: their number)"),
    ("net_amount", "approved_amount − refunded_amount: what the approved sales of the range "
     "bring in, per currency"),
    ("suspects_at_stake", "Σ amount of the later transaction of each suspected double "
     "charge: what the customers paid twice if every suspect is a real duplicate"),
    ("exceptions_at_stake", "per settlement exception, the money in question: ours_only our "
     "amount; acquirer_only the clearing's amount; amount_mismatch the difference between "
     "ours and the clearing's; duplicate_rrn the clearing's net amount beyond ours (all of "
     "it when we have no transaction) — in absolute value, in the exception's currency"),
    ("synthesized", "a day whose lake partitions were made up by `analytics.synth` (the "
     "demo's past days, a benchmark's lake), not the server's traffic: compare the real "
     "day with them as a model, not as history"),
]  # fmt: skip

GROUPS: list[tuple[str, str, Terms]] = [
    ("money", "Money (money_volume.csv and values at stake)", MONEY_TERMS),
    ("audit", "Daily audit (daily_summary.csv, docs/contract.md §5.2)", AUDIT_METRICS),
    ("settlement", "Settlement reconciliation (docs/contract.md §5.4)", SETTLEMENT_KINDS),
    ("offline", "Offline selling (offline_summary.csv, docs/contract.md §5.3)", OFFLINE_COLUMNS),
]


def names(term: str) -> list[str]:
    """The column names one row of a table defines: ``"forward_delay_p50_s, _p95_s,
    _max_s"`` names forward_delay_p50_s, forward_delay_p95_s and forward_delay_max_s."""
    found: list[str] = []
    for part in (p.strip() for p in term.split(",")):
        if part.startswith("_") and found:
            stem = found[-1][: found[-1].rfind("_p")]
            found.append(stem + part)
        else:
            found.append(part)
    return found


_DEFINED: set[tuple[str, str]] = set()
_FIRST_GROUP: dict[str, str] = {}
for _group, _, _terms in GROUPS:
    for _term, _ in _terms:
        for _name in names(_term):
            _DEFINED.add((_group, _name))
            _FIRST_GROUP.setdefault(_name, _group)


def is_defined(name: str, group: str | None = None) -> bool:
    return (group, name) in _DEFINED if group else name in _FIRST_GROUP


def anchor(name: str, group: str | None = None) -> str:
    """The definition's id in the report (``group``: where to look first)."""
    if group is None or (group, name) not in _DEFINED:
        group = _FIRST_GROUP[name]
    return f"def-{group}-{name}"


def to_html(definition: str) -> str:
    """The contract's Markdown (``code`` spans) as HTML, escaped."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", escape(definition, quote=False))


def section() -> str:
    """``<section id="definitions">``: every term the report uses, by table."""
    parts = ['<section id="definitions">']
    for group, title, terms in GROUPS:
        rows = "".join(
            "<tr>"
            + '<td class="t">'
            + "".join(f'<code id="{anchor(n, group)}">{escape(n)}</code> ' for n in names(term))
            + f'</td><td class="t">{to_html(definition)}</td></tr>'
            for term, definition in terms
        )
        parts.append(
            f'<h3>{escape(title)}</h3><table class="definitions" data-group="{group}">'
            f"<thead><tr><th>term</th><th>definition</th></tr></thead><tbody>{rows}</tbody>"
            "</table>"
        )
    parts.append("</section>")
    return "".join(parts)
