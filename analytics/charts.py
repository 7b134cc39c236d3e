"""The report's charts, drawn by matplotlib's SVG backend and inlined: no JavaScript, no
font or image to load (the glyphs are paths), nothing fetched — the page opens offline.

Ticks (MaxNLocator's round steps), legends (outside the axes, under them) and the room
labels need (the constrained layout) are matplotlib's job. Each chart is a
``<figure class="chart">``: the SVG (its ids prefixed by the chart's own, so several charts
share one page; its title and legend carry the ids ``…-chart-title`` and
``…-chart-legend``), then its values as a table (``<td class="point" data-…>``: a reader
gets the exact numbers, a test what was drawn). Days the lake has synthesized are shaded.
"""

from __future__ import annotations

import hashlib
import io
import math
import re
from collections.abc import Callable, Collection, Sequence
from html import escape
from typing import Any, cast

from cycler import cycler
from matplotlib import rc_context
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, MaxNLocator, PercentFormatter

from analytics.html_table import count, exponent, money, percent

COLORS = ["#1565c0", "#ef6c00", "#6a1b9a", "#2e7d32", "#c62828"]
SYNTH_FILL, SYNTH_EDGE = "#eceff1", "#b0bec5"
STYLE: dict[str, Any] = {
    "svg.fonttype": "path",  # glyphs as paths: the same text on every machine, no font
    "font.family": "DejaVu Sans",  # shipped with matplotlib
    "font.size": 8.5,
    "axes.titlesize": 10,
    "axes.titleweight": "bold",
    "axes.titlelocation": "left",
    "axes.titlepad": 8,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.edgecolor": "#9aa0ad",
    "axes.grid": True,
    "axes.grid.axis": "y",
    "axes.axisbelow": True,
    "grid.color": "#e3e6ee",
    "xtick.color": "#4a5060",
    "ytick.color": "#4a5060",
    "axes.prop_cycle": cycler(color=COLORS),
    "legend.frameon": False,
    "legend.fontsize": 8.5,
}
SMALL, WIDE = (4.6, 2.6), (8.8, 2.9)  # inches, at 72 points each
Unit = str  # "rate" | "count" | a currency code (amounts in minor units)


def _short(labels: Sequence[str]) -> list[str]:
    """ISO days of one year as MM-DD; anything else as it is."""
    days = all(re.fullmatch(r"\d{4}-\d\d-\d\d", label) for label in labels)
    if days and len({label[:4] for label in labels}) == 1:
        return [label[5:] for label in labels]
    return list(labels)


def shown(value: float | None, unit: Unit) -> str:
    if unit == "rate":
        return percent(value, 3)
    if unit == "count":
        return count(value)
    return money(None if value is None else round(value), unit)


def _digits(locator: MaxNLocator, top: float) -> int:
    """The decimals a percentage tick needs: 0.5 % steps read 0.5 %, 1.0 %, not 0.50 %."""
    ticks = locator.tick_values(0, top)
    step = (ticks[1] - ticks[0]) * 100 if len(ticks) > 1 else 1.0
    return next((d for d in range(6) if abs(round(step, d) - step) < 1e-9 * max(step, 1)), 6)


def _value_axis(ax: Axes, unit: Unit, peak: float) -> None:
    steps = [1, 2, 2.5, 5, 10]
    if unit == "rate":
        top = peak * 1.12 if peak > 0 else 0.01
        locator = MaxNLocator(nbins=5, steps=steps)
        ax.yaxis.set_major_locator(locator)
        ax.yaxis.set_major_formatter(PercentFormatter(xmax=1.0, decimals=_digits(locator, top)))
        ax.set_ylim(0, top)
    elif unit == "count":
        ax.yaxis.set_major_locator(MaxNLocator(nbins=5, steps=steps, integer=True))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
        ax.set_ylim(0, peak * 1.12 if peak > 0 else 1)
    else:  # money: the axis in currency units
        scale = 10 ** exponent(unit)
        ax.yaxis.set_major_locator(MaxNLocator(nbins=5, steps=steps))
        digits = 0 if peak / scale >= 10 else 2
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v / scale:,.{digits}f}"))
        ax.set_ylabel(unit)
        ax.set_ylim(0, peak * 1.12 if peak > 0 else scale)


def _shade(ax: Axes, labels: Sequence[str], synthesized: Collection[str]) -> Patch | None:
    """Grey bands behind the synthesized days; the legend's entry for them."""
    marked = [i for i, label in enumerate(labels) if label in synthesized]
    if not marked:
        return None
    runs: list[list[int]] = []
    for i in marked:
        if runs and runs[-1][-1] == i - 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    for run in runs:
        ax.axvspan(run[0] - 0.5, run[-1] + 0.5, facecolor=SYNTH_FILL, edgecolor="none", zorder=0)
    return Patch(facecolor=SYNTH_FILL, edgecolor=SYNTH_EDGE, label="synthesized days")


def _category_axis(ax: Axes, labels: Sequence[str]) -> None:
    texts = _short(labels)
    ax.set_xlim(-0.5, len(labels) - 0.5)
    ax.xaxis.set_major_locator(MaxNLocator(nbins=8, integer=True, min_n_ticks=1))
    ax.xaxis.set_major_formatter(
        FuncFormatter(lambda x, _: texts[int(x)] if x == int(x) and 0 <= x < len(texts) else "")
    )
    if max((len(t) for t in texts), default=0) * min(len(texts), 8) > 60:
        ax.tick_params(axis="x", labelrotation=25)
        for label in ax.get_xticklabels():
            label.set_horizontalalignment("right")


def _legend(fig: Figure, ax: Axes, extra: Patch | None, series: int) -> None:
    handles, _ = ax.get_legend_handles_labels()
    if series == 1:  # the title names the only series
        handles = []
    if extra is not None:
        handles.append(extra)
    if series > 1 or extra is not None:
        # as many columns as the figure's width holds: a legend wider than it is cut off
        columns = min(len(handles), max(1, int(fig.get_figwidth() // 2.2)))
        legend = fig.legend(handles=handles, loc="outside lower center", ncols=columns)
        legend.set_gid("chart-legend")


_SVG_NOISE = [
    re.compile(r"<\?xml[^>]*\?>\s*"),
    re.compile(r"<!DOCTYPE[^>]*>\s*"),
    re.compile(r"<!--.*?-->\s*", re.S),
    re.compile(r"<metadata>.*?</metadata>\s*", re.S),
    re.compile(r'\s+xmlns(:\w+)?="[^"]*"'),
]


def _inline(svg: str, key: str, title: str) -> str:
    """matplotlib's SVG document as an element of the page: no XML prolog, metadata or
    namespace URIs (HTML gives inline SVG its namespace), ids prefixed with ``key``, its
    style scoped to the chart, sized by the page."""
    for pattern in _SVG_NOISE:
        svg = pattern.sub("", svg)
    ids = set(re.findall(r'\bid="([^"]+)"', svg))
    svg = re.sub(
        r'(\bid="|url\(#|href="#)([^")]+)',
        lambda m: m[1] + (f"{key}-{m[2]}" if m[2] in ids else m[2]),
        svg,
    )
    svg = svg.replace("xlink:href=", "href=").replace("*{", f"#{key}-figure_1 *{{")
    return re.sub(
        r'<svg width="([\d.]+)pt" height="([\d.]+)pt"',
        lambda m: (
            f'<svg class="chart" role="img" aria-label="{escape(title)}" '
            f'style="width:{float(m[1]) * 4 / 3:.0f}px;max-width:100%;height:auto"'
        ),
        svg,
        count=1,
    )


def _render(
    title: str, size: tuple[float, float], draw: Callable[[Figure], None], data: object
) -> str:
    """``draw`` on a new figure, as an inline SVG; its ids from ``title`` and ``data``."""
    key = "c" + hashlib.sha1(repr((title, size, data)).encode()).hexdigest()[:8]
    buffer = io.StringIO()
    with rc_context(cast(Any, {**STYLE, "svg.hashsalt": key})):
        fig = Figure(figsize=size, layout="constrained", dpi=72)
        draw(fig)
        fig.savefig(buffer, format="svg", metadata={"Date": None, "Creator": None})
    return _inline(buffer.getvalue(), key, title)


def _values(head: str, rows: list[tuple[str, list[tuple[str, str]]]], names: list[str]) -> str:
    """The chart's values, under it: one row per label, one cell per series."""
    th = "".join(f"<th>{escape(n)}</th>" for n in names)
    body = "".join(
        f'<tr><td class="t">{escape(label)}</td>{"".join(c for _, c in cells)}</tr>'
        for label, cells in rows
    )
    return (
        '<details class="chart-data"><summary>values</summary><table>'
        f"<thead><tr><th>{escape(head)}</th>{th}</tr></thead><tbody>{body}</tbody>"
        "</table></details>"
    )


def _number(value: float | None) -> float:
    return math.nan if value is None else float(value)


def line_chart(
    title: str,
    labels: Sequence[str],
    values: Sequence[float | None],
    *,
    unit: Unit = "rate",
    synthesized: Collection[str] = (),
) -> str:
    """One value per day (a rate by default); the synthesized days shaded."""

    def draw(fig: Figure) -> None:
        ax = fig.subplots()
        ax.set_title(title).set_gid("chart-title")
        synth = _shade(ax, labels, synthesized)
        ax.plot(range(len(labels)), [_number(v) for v in values], marker="o", markersize=3.5,
                linewidth=1.8, label=title, clip_on=False)  # fmt: skip
        _category_axis(ax, labels)
        _value_axis(ax, unit, max((v for v in values if v is not None), default=0.0))
        _legend(fig, ax, synth, 1)

    svg = _render(title, SMALL, draw, (labels, values, unit))
    cells = [
        (
            label,
            [
                (
                    "",
                    f'<td class="point" data-date="{escape(label)}" '
                    f'data-value="{"" if v is None else f"{v:.6f}"}">{shown(v, unit)}</td>',
                )
            ],
        )
        for label, v in zip(labels, values, strict=True)
    ]
    return f'<figure class="chart">{svg}{_values("day", cells, ["value"])}</figure>'


def bar_chart(
    title: str,
    labels: Sequence[str],
    series: Sequence[tuple[str, Sequence[float]]],
    *,
    unit: Unit = "rate",
    synthesized: Collection[str] = (),
    wide: bool = True,
) -> str:
    """Grouped bars: one group per label, one bar per series (rates by default)."""

    def draw(fig: Figure) -> None:
        ax = fig.subplots()
        ax.set_title(title).set_gid("chart-title")
        synth = _shade(ax, labels, synthesized)
        width = 0.8 / max(1, len(series))
        for s, (name, values) in enumerate(series):
            offset = (s - (len(series) - 1) / 2) * width
            ax.bar([i + offset for i in range(len(labels))], values, width, label=name)
        _category_axis(ax, labels)
        peak = max((v for _, values in series for v in values), default=0.0)
        _value_axis(ax, unit, peak)
        _legend(fig, ax, synth, len(series))

    svg = _render(title, WIDE if wide else SMALL, draw, (labels, series, unit))
    rows = [
        (
            label,
            [
                (
                    name,
                    f'<td class="point" data-group="{escape(label)}" data-series="{escape(name)}"'
                    f' data-value="{values[g]:.6f}">{shown(values[g], unit)}</td>',
                )
                for name, values in series
            ],
        )
        for g, label in enumerate(labels)
    ]
    head = [name for name, _ in series]
    return f'<figure class="chart">{svg}{_values("", rows, head)}</figure>'
