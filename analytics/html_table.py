"""HTML tables of the report: a cell rendered by kind (rate, num, code, text), escaped."""

from __future__ import annotations

from html import escape
from typing import Any

from analytics.charts import percent

Rows = list[dict[str, Any]]


def cell(value: Any, kind: str) -> str:
    if value is None:
        return "–"
    if kind == "rate":
        return percent(value)
    if kind == "num":
        return f"{value:,.1f}" if isinstance(value, float) else f"{value:,}"
    return f"<code>{escape(str(value))}</code>" if kind == "code" else escape(str(value))


def table(rows: Rows, columns: list[tuple[str, str, str]], empty: str) -> str:
    if not rows:
        return f'<p class="muted">{escape(empty)}</p>'
    head = "".join(f"<th>{escape(label)}</th>" for _, label, _ in columns)
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="{"t" if kind in ("text", "code") else ""}">{cell(row[key], kind)}</td>'
            for key, _, kind in columns
        )
        + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
