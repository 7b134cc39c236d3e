"""The create-path goals, judged on ratios paired per round (each round runs every scenario
back to back, so a paired ratio cancels the shared machine's slow drift).

Throughput ratios divide two scenarios' req/s in the same round; latency ratios divide their
p99 in the same round (each round's own p99); latency differences subtract them. The figure
is the median over rounds. Every create — idempay's and the peers' — makes one 0200 to the
same acquirer host, so the goals hold per acquirer setting (a cell of the bench's matrix):
some apply only with added acquirer latency, or only at high concurrency.
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
# (name, top, bottom, series): top − bottom in the same round (milliseconds)
PEER_DIFFERENCES = (
    ("p99 create − p99 plain (ms)", "create", "plain", "p99_ms"),
    ("p99 SQLite create − p99 plain (ms)", "create-sqlite", "plain", "p99_ms"),
)


@dataclass(frozen=True, slots=True)
class Goal:
    number: int
    text: str
    checks: tuple[tuple[str, str, float], ...]  # (ratio name, "≥" | "≤", bound)
    latency: str = "any"  # "any" | "none" (no added acquirer latency) | "added"
    min_concurrency: int = 0


# Goals 1–5 of the create-path issue (6, Citus, and 7, nothing weakened, are not bench figures).
GOALS = (
    Goal(1, "create on Postgres ≥ 1.2× idemkit and ≥ 0.5× plain",
         (("create ÷ idemkit", "≥", 1.2), ("create ÷ plain", "≥", 0.5))),
    Goal(2, "p99 of create ≤ 1.5× plain's p99", (("p99 create ÷ p99 plain", "≤", 1.5),),
         latency="none"),
    Goal(2, "p99 of create ≤ plain's p99 + 30 ms",
         (("p99 create − p99 plain (ms)", "≤", 30.0),), latency="added"),
    Goal(3, "replay and lookup on Postgres (no Redis) ≥ 0.8× plain",
         (("replay ÷ plain", "≥", 0.8), ("lookup ÷ plain", "≥", 0.8))),
    Goal(4, "SQLite create ≥ 0.35× plain, p99 ≤ 2× plain's",
         (("SQLite create ÷ plain", "≥", 0.35), ("p99 SQLite create ÷ p99 plain", "≤", 2.0))),
    Goal(5, "with acquirer latency, 200 in flight: create ≥ 0.8× plain",
         (("create ÷ plain", "≥", 0.8),), latency="added", min_concurrency=200),
)  # fmt: skip


def applies(goal: Goal, *, latency_ms: float, concurrency: int) -> bool:
    """Whether ``goal`` is judged in a cell with this added acquirer latency and concurrency."""
    if goal.latency == "none" and latency_ms > 0 or goal.latency == "added" and latency_ms <= 0:
        return False
    return concurrency >= goal.min_concurrency


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
            out[name] = _entry(paired)
    for name, top, bottom, series in PEER_DIFFERENCES:
        upper, lower = _by_round(rounds, top, series), _by_round(rounds, bottom, series)
        apart = [upper[n] - lower[n] for n in sorted(upper.keys() & lower.keys())]
        if apart:
            out[name] = _entry(apart)
    return out


def _entry(values: list[float]) -> dict[str, Any]:
    return {
        "value": statistics.median(values),
        "round_min": min(values),
        "round_max": max(values),
        "per_round": values,
    }


def judge(
    derived: dict[str, dict[str, Any]], *, latency_ms: float = 0.0, concurrency: int = 50
) -> list[dict[str, Any]]:
    """Each goal that applies to this cell met, missed, or not measured (a scenario of it
    did not run)."""
    verdicts = []
    for goal in GOALS:
        if not applies(goal, latency_ms=latency_ms, concurrency=concurrency):
            continue
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


def render(
    console: Console, derived: dict[str, Any], verdicts: list[dict[str, Any]], cell: str = ""
) -> None:
    suffix = f" — {cell}" if cell else ""
    table = Table(
        title=f"against the peers: median of per-round ratios{suffix}", title_justify="left"
    )
    for header in ("figure", "paired", "per-round range"):
        table.add_column(header, justify="left" if header == "figure" else "right")
    for name, d in derived.items():
        table.add_row(name, f"{d['value']:.3f}", f"{d['round_min']:.2f}–{d['round_max']:.2f}")
    console.print(table)
    goals = Table(title=f"create-path goals (paired medians){suffix}", title_justify="left")
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
