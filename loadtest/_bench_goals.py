"""Issue 13's goals, judged on ratios paired per round (each round runs every scenario back
to back, so a paired ratio cancels the shared machine's slow drift).

Throughput ratios divide two scenarios' req/s in the same round; latency ratios divide their
p99 in the same round (each round's own p99). The figure is the median over rounds.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

# (name, top scenario, bottom scenario, series): "rate" (req/s) or "p99_ms" (this round's p99)
PEER_PAIRS = (
    ("create ÷ idemkit", "create", "idemkit", "rate"),
    ("create ÷ plain", "create", "plain", "rate"),
    ("bypassed ÷ plain", "bypassed", "plain", "rate"),
    ("idemkit ÷ plain", "idemkit", "plain", "rate"),
    ("replay ÷ plain", "replay", "plain", "rate"),
    ("lookup ÷ plain", "lookup", "plain", "rate"),
    ("SQLite create ÷ plain", "create-sqlite", "plain", "rate"),
    ("SQLite create ÷ create", "create-sqlite", "create", "rate"),
    ("p99 create ÷ p99 plain", "create", "plain", "p99_ms"),
    ("p99 idemkit ÷ p99 plain", "idemkit", "plain", "p99_ms"),
    ("p99 SQLite create ÷ p99 plain", "create-sqlite", "plain", "p99_ms"),
    ("create, 2 workers ÷ create", "create-2w", "create", "rate"),  # goal 5: a second worker
    ("create, 2 workers ÷ plain", "create-2w", "plain", "rate"),
    ("p99 create, 2 workers ÷ p99 plain", "create-2w", "plain", "p99_ms"),
)


@dataclass(frozen=True, slots=True)
class Goal:
    number: int
    text: str
    checks: tuple[tuple[str, str, float], ...]  # (ratio name, "≥" | "≤", bound)


GOALS = (
    Goal(1, "create on Postgres ≥ 1.2× idemkit and ≥ 0.5× plain",
         (("create ÷ idemkit", "≥", 1.2), ("create ÷ plain", "≥", 0.5))),
    Goal(2, "p99 of create ≤ 1.5× plain's p99", (("p99 create ÷ p99 plain", "≤", 1.5),)),
    Goal(3, "replay and lookup on Postgres (no Redis) ≥ 0.6× plain",
         (("replay ÷ plain", "≥", 0.6), ("lookup ÷ plain", "≥", 0.6))),
    Goal(4, "SQLite create ≥ 0.35× plain, p99 ≤ 2× plain's",
         (("SQLite create ÷ plain", "≥", 0.35), ("p99 SQLite create ÷ p99 plain", "≤", 2.0))),
)  # fmt: skip


def _by_round(rounds: list[dict[str, Any]], scenario: str, series: str) -> dict[int, float]:
    return {
        r["round"]: r[series]
        for r in rounds
        if r["scenario"] == scenario and r.get(series) and r.get("ok", True)
    }


def peer_ratios(rounds: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name, top, bottom, series in PEER_PAIRS:
        upper, lower = _by_round(rounds, top, series), _by_round(rounds, bottom, series)
        paired = [upper[n] / lower[n] for n in sorted(upper.keys() & lower.keys())]
        if paired:
            out[name] = {
                "value": statistics.median(paired),
                "round_min": min(paired),
                "round_max": max(paired),
                "per_round": paired,
            }
    return out


def judge(derived: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Each goal met, missed, or not measured (a scenario of it did not run)."""
    verdicts = []
    for goal in GOALS:
        checks = []
        for name, sense, bound in goal.checks:
            value = derived.get(name, {}).get("value")
            met = None if value is None else (value >= bound if sense == "≥" else value <= bound)
            bounded = f"{sense} {bound:g}"
            checks.append({"ratio": name, "bound": bounded, "value": value, "met": met})
        states = [c["met"] for c in checks]
        met = None if None in states else all(states)
        verdicts.append({"goal": goal.number, "text": goal.text, "met": met, "checks": checks})
    return verdicts


def render(console: Console, derived: dict[str, Any], verdicts: list[dict[str, Any]]) -> None:
    table = Table(title="against the peers: median of per-round ratios", title_justify="left")
    for header in ("figure", "paired", "per-round range"):
        table.add_column(header, justify="left" if header == "figure" else "right")
    for name, d in derived.items():
        table.add_row(name, f"{d['value']:.3f}", f"{d['round_min']:.2f}–{d['round_max']:.2f}")
    console.print(table)
    goals = Table(title="issue 13 goals (paired medians)", title_justify="left")
    for header in ("goal", "check", "value", "status"):
        goals.add_column(header, justify="right" if header == "value" else "left")
    for verdict in verdicts:
        for check in verdict["checks"]:
            value = "—" if check["value"] is None else f"{check['value']:.3f}"
            met = check["met"]
            status = "not run" if met is None else ("[green]met[/]" if met else "[red]missed[/]")
            goals.add_row(
                f"{verdict['goal']}. {verdict['text']}",
                f"{check['ratio']} {check['bound']}",
                value,
                status,
            )
    console.print(goals)
