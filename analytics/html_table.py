"""The report's values as text, and its HTML tables: a cell rendered by kind, escaped.

Kinds: ``rate`` (a fraction as a percentage), ``num``, ``money`` (minor units of the row's
``currency`` as currency units: 54990 BRL is "549.90 BRL"), ``duration`` (seconds, in
s, min, h or d as they grow), ``day`` (an ISO day, marked when synthesized), ``code``,
``text``. A column whose key the report defines (``analytics.report_definitions``) has its
header linked to the definition.
"""

from __future__ import annotations

from collections.abc import Collection
from html import escape
from typing import Any

from analytics.report_definitions import anchor, is_defined

Rows = list[dict[str, Any]]
Column = tuple[str, str, str]

# ISO 4217 minor units where they are not 2 (the API takes amounts in minor units).
EXPONENTS = {
    **dict.fromkeys(
        ["BIF", "CLP", "DJF", "GNF", "ISK", "JPY", "KMF", "KRW", "PYG", "RWF", "UGX", "UYI"]
        + ["VND", "VUV", "XAF", "XOF", "XPF"],
        0,
    ),
    **dict.fromkeys(["BHD", "IQD", "JOD", "KWD", "LYD", "OMR", "TND"], 3),
    **dict.fromkeys(["CLF", "UYW"], 4),
}
SYNTH_BADGE = '<span class="synth">synthesized</span>'


def exponent(currency: str) -> int:
    return EXPONENTS.get(currency.upper(), 2)


def percent(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value * 100:.{digits}f}%"


def count(value: float | None) -> str:
    return "–" if value is None else f"{value:,.0f}"


def money(minor: int | None, currency: str | None) -> str:
    """``minor`` units of ``currency`` in currency units: ``money(54990, "BRL")`` is
    ``"549.90 BRL"``; without a currency, the minor units said as such."""
    if minor is None:
        return "–"
    if not currency:
        return f"{minor:,} (minor units)"
    digits = exponent(currency)
    units = abs(minor) / 10**digits
    return f"{'-' if minor < 0 else ''}{units:,.{digits}f} {currency}"


def duration(seconds: float | None) -> str:
    """Seconds as a reader says them: 12.5 s, 4.2 min, 7.9 h, 3.1 d."""
    if seconds is None:
        return "–"
    size = abs(seconds)
    if size < 120:
        return f"{seconds:.1f} s"
    if size < 2 * 3600:
        return f"{seconds / 60:.1f} min"
    if size < 2 * 86_400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86_400:.1f} d"


def day(value: str, synthesized: Collection[str] = ()) -> str:
    return escape(value) + (f" {SYNTH_BADGE}" if value in synthesized else "")


def cell(
    value: Any, kind: str, *, currency: str | None = None, synthesized: Collection[str] = ()
) -> str:
    if value is None:
        return "–"
    if kind == "rate":
        return percent(value)
    if kind == "num":
        return f"{value:,.1f}" if isinstance(value, float) else f"{value:,}"
    if kind == "money":
        return money(value, currency)
    if kind == "duration":
        return duration(value)
    if kind == "day":
        return day(str(value), synthesized)
    return f"<code>{escape(str(value))}</code>" if kind == "code" else escape(str(value))


def header(key: str, label: str, terms: str | None = None) -> str:
    if is_defined(key):
        return f'<th><a class="term" href="#{anchor(key, terms)}">{escape(label)}</a></th>'
    return f"<th>{escape(label)}</th>"


def table(
    rows: Rows,
    columns: list[Column],
    empty: str,
    *,
    synthesized: Collection[str] = (),
    terms: str | None = None,
) -> str:
    """``columns``: (key, label, kind); ``synthesized``: the days a ``day`` cell marks;
    ``terms``: the definitions' group the headers link to first (``audit``, ``offline``…)."""
    if not rows:
        return f'<p class="muted">{escape(empty)}</p>'
    head = "".join(header(key, label, terms) for key, label, _ in columns)
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="{"t" if kind in ("text", "code", "day") else ""}">'
            f"{cell(row[key], kind, currency=row.get('currency'), synthesized=synthesized)}</td>"
            for key, _, kind in columns
        )
        + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
