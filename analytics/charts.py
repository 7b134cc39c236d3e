"""Inline SVG charts for the report: plain strings, no JavaScript, nothing loaded.

Each data point is an element with ``class="point"`` and ``data-*`` attributes, and a
``<title>`` tooltip, so the chart reads on screen and a test can count what was drawn.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

WIDTH, HEIGHT = 640, 220
LEFT, RIGHT, TOP, BOTTOM = 56, 16, 28, 36
GRID_LINES = 4


def _ticks(peak: float) -> float:
    """A round axis maximum at or above ``peak``."""
    if peak <= 0:
        return 1.0
    for step in (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0):
        if peak <= step:
            return step
    magnitude = 1.0
    while magnitude * 10 < peak:
        magnitude *= 10
    for factor in (1, 2, 2.5, 5, 10):
        if peak <= factor * magnitude:
            return factor * magnitude
    return peak


def percent(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value * 100:.{digits}f}%"


def _frame(title: str, y_max: float, width: int) -> list[str]:
    plot_h = HEIGHT - TOP - BOTTOM
    digits = 2 if y_max < 0.04 else 1
    parts = [
        f'<svg class="chart" role="img" aria-label="{escape(title)}" width="{width}" '
        f'height="{HEIGHT}" viewBox="0 0 {width} {HEIGHT}">',
        f'<text class="chart-title" x="{LEFT}" y="16">{escape(title)}</text>',
    ]
    for i in range(GRID_LINES + 1):
        value = y_max * i / GRID_LINES
        y = TOP + plot_h - plot_h * i / GRID_LINES
        parts.append(
            f'<line class="grid" x1="{LEFT}" x2="{width - RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/>'
            f'<text class="axis" x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">'
            f"{percent(value, digits)}</text>"
        )
    return parts


def _x_labels(labels: Sequence[str], xs: Sequence[float]) -> list[str]:
    every = max(1, len(labels) // 5)
    return [
        f'<text class="axis" x="{x:.1f}" y="{HEIGHT - 12}" text-anchor="middle">'
        f"{escape(label[5:] if len(label) == 10 else label)}</text>"
        for i, (label, x) in enumerate(zip(labels, xs, strict=True))
        if i % every == 0 or i == len(labels) - 1
    ]


def line_chart(
    title: str, labels: Sequence[str], values: Sequence[float | None], *, width: int = 360
) -> str:
    """A rate over days (fractions in [0, 1]); one point per day."""
    y_max = _ticks(max((v for v in values if v is not None), default=0.0))
    plot_w, plot_h = width - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    step = plot_w / max(1, len(labels) - 1)
    xs = [LEFT + (step * i if len(labels) > 1 else plot_w / 2) for i in range(len(labels))]
    parts = _frame(title, y_max, width)
    points = [
        (x, TOP + plot_h - plot_h * (v / y_max), label, v)
        for x, label, v in zip(xs, labels, values, strict=True)
        if v is not None
    ]
    if len(points) > 1:
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y, _, _ in points)
        parts.append(f'<polyline class="series" points="{path}"/>')
    for x, y, label, v in points:
        parts.append(
            f'<circle class="point" cx="{x:.1f}" cy="{y:.1f}" r="3.5" '
            f'data-date="{escape(label)}" data-value="{v:.6f}">'
            f"<title>{escape(label)}: {percent(v, 3)}</title></circle>"
        )
    parts.extend(_x_labels(labels, xs))
    parts.append("</svg>")
    return "".join(parts)


def bar_chart(
    title: str, labels: Sequence[str], series: Sequence[tuple[str, Sequence[float]]]
) -> str:
    """Grouped bars of rates: one group per label, one bar per series."""
    peak = max((v for _, values in series for v in values), default=0.0)
    y_max = _ticks(peak)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    group_w = plot_w / max(1, len(labels))
    bar_w = group_w * 0.8 / max(1, len(series))
    parts = _frame(title, y_max, WIDTH)
    for g, label in enumerate(labels):
        x0 = LEFT + g * group_w + group_w * 0.1
        for s, (name, values) in enumerate(series):
            value = values[g]
            height = plot_h * (value / y_max)
            parts.append(
                f'<rect class="point bar s{s}" x="{x0 + s * bar_w:.1f}" '
                f'y="{TOP + plot_h - height:.1f}" width="{bar_w:.1f}" height="{height:.1f}" '
                f'data-group="{escape(label)}" data-series="{escape(name)}" '
                f'data-value="{value:.6f}"><title>{escape(label)} · {escape(name)}: '
                f"{percent(value, 3)}</title></rect>"
            )
        parts.append(
            f'<text class="axis" x="{LEFT + g * group_w + group_w / 2:.1f}" y="{HEIGHT - 12}" '
            f'text-anchor="middle">{escape(label)}</text>'
        )
    for s, (name, _) in enumerate(series):
        parts.append(
            f'<rect class="bar s{s}" x="{WIDTH - RIGHT - 120}" y="{8 + s * 12}" width="8" '
            f'height="8"/><text class="legend" x="{WIDTH - RIGHT - 108}" y="{16 + s * 12}">'
            f"{escape(name)}</text>"
        )
    parts.append("</svg>")
    return "".join(parts)
