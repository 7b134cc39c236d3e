"""Figures from the rounds: medians, pooled percentiles, CPU split, ratios, goals, tables."""

from __future__ import annotations

import statistics
from collections import Counter
from typing import Any

from rich.console import Console
from rich.table import Table

from loadtest._bench_profile import Profile

ERROR_BUDGET_PCT = 0.5
GOALS = {  # ratio name → minimum
    "create ÷ bypassed": 0.8,
    "replay ÷ create": 2.0,
}
P99_CREATE_GOAL_MS = 50.0


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list (0 when empty)."""
    if not sorted_values:
        return 0.0
    rank = max(1, round(q / 100.0 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def _cores(rounds: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] / r["cpu"]["wall_s"] for r in rounds if r["cpu"]["wall_s"] > 0)


def summarize(rounds: list[dict[str, Any]], latencies: list[float]) -> dict[str, Any]:
    """One scenario's figures from its rounds (``rate`` is req/s, or tps for pgbench)."""
    rates = [r["rate"] for r in rounds]
    requests = sum(r["requests"] for r in rounds)
    errors = sum(r["errors"] for r in rounds)
    for r in rounds:
        cpu = r["cpu"]
        r["generator_s"] = r["generator_cpu_s"]
        r["server_s"], r["postgres_s"] = cpu["server_s"], cpu["postgres_s"]
        r["other_s"] = max(
            0.0, cpu["machine_s"] - r["generator_s"] - cpu["server_s"] - cpu["postgres_s"]
        )
    ordered = sorted(latencies)
    statuses: dict[str, int] = {}
    for r in rounds:
        for label, count in r.get("statuses", {}).items():
            statuses[label] = statuses.get(label, 0) + count
    per_request = {
        f"{part}_us_per_req": 1e6 * sum(r[f"{part}_s"] for r in rounds) / max(requests, 1)
        for part in ("generator", "server", "postgres")
    }
    return {
        "rate_median": statistics.median(rates),
        "rate_min": min(rates),
        "rate_max": max(rates),
        "rates": rates,
        "p50_ms": percentile(ordered, 50),
        "p99_ms": percentile(ordered, 99),
        "latency_source": "pooled per-request" if latencies else "",
        "requests": requests,
        "errors": errors,
        "error_pct": 100.0 * errors / max(requests, 1),
        "statuses": statuses,
        "cores": {
            p: _cores(rounds, f"{p}_s") for p in ("generator", "server", "postgres", "other")
        },
        **per_request,
    }


def ratios(figures: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Ratios of median rates, with the range of the same ratio taken round by round."""
    pairs = [
        ("create ÷ bypassed", "create", "bypassed"),
        ("replay ÷ create", "replay", "create"),
        ("lookup ÷ create", "lookup", "create"),
        ("create ÷ pgbench", "create", "pgbench"),
    ]
    out: dict[str, dict[str, Any]] = {}
    for name, top, bottom in pairs:
        if top not in figures or bottom not in figures or not figures[bottom]["rate_median"]:
            continue
        per_round = [
            a / b
            for a, b in zip(figures[top]["rates"], figures[bottom]["rates"], strict=False)
            if b
        ]
        entry: dict[str, Any] = {
            "value": figures[top]["rate_median"] / figures[bottom]["rate_median"],
            "round_min": min(per_round, default=0.0),
            "round_max": max(per_round, default=0.0),
        }
        if name in GOALS:
            entry["goal"] = f"≥ {GOALS[name]:g}"
            entry["met"] = entry["value"] >= GOALS[name]
        out[name] = entry
    if "create" in figures and "bypassed" in figures:
        out["bypassed ÷ create, server CPU per request"] = {
            "value": figures["bypassed"]["server_us_per_req"]
            / max(figures["create"]["server_us_per_req"], 1e-9),
        }
    if "create" in figures:
        p99 = figures["create"]["p99_ms"]
        out["p99 create (ms)"] = {
            "value": p99,
            "goal": f"≤ {P99_CREATE_GOAL_MS:g}",
            "met": p99 <= P99_CREATE_GOAL_MS,
        }
    return out


def render(
    console: Console,
    figures: dict[str, dict[str, Any]],
    derived: dict[str, dict[str, Any]],
    context: dict[str, Any],
) -> None:
    table = Table(title=f"idempay bench — {context['title']}", title_justify="left")
    headers = ("scenario", "req/s", "min–max", "p50 ms", "p99 ms", "requests", "errors")
    for header in headers:
        table.add_column(header, justify="left" if header == "scenario" else "right")
    table.add_column("CPU cores gen/srv/pg/other", justify="right")
    table.add_column("CPU µs/req srv/pg", justify="right")
    for name, f in figures.items():
        cores = f["cores"]
        is_pg = name == "pgbench"
        table.add_row(
            name + (" (tps)" if is_pg else ""),
            f"{f['rate_median']:,.0f}",
            f"{f['rate_min']:,.0f}–{f['rate_max']:,.0f}",
            "—" if is_pg else f"{f['p50_ms']:.1f}",
            f"avg {f['latency_avg_ms']:.1f}" if is_pg else f"{f['p99_ms']:.1f}",
            f"{f['requests']:,}",
            f"{f['errors']} ({f['error_pct']:.2f} %)",
            " / ".join(f"{cores[p]:.2f}" for p in ("generator", "server", "postgres", "other")),
            ("—" if is_pg else f"{f['server_us_per_req']:,.0f}")
            + f" / {f['postgres_us_per_req']:,.0f}",
        )
    console.print(table)
    goals = Table(title="ratios (of median req/s; per-round range) and goals", title_justify="left")
    for header in ("figure", "value", "per-round range", "goal", "status"):
        goals.add_column(header)
    for name, d in derived.items():
        ranged = f"{d['round_min']:.2f}–{d['round_max']:.2f}" if "round_min" in d else ""
        met = d.get("met")
        status = "" if met is None else ("[green]met[/]" if met else "[red]missed[/]")
        goals.add_row(name, f"{d['value']:.2f}", ranged, d.get("goal", ""), status)
    if "pgbench" not in figures:
        goals.add_row("create ÷ pgbench", "—", "", "", context.get("pgbench_note", ""))
    console.print(goals)


def render_profile(console: Console, profile: Profile, n: int = 15) -> None:
    console.print(f"py-spy: {profile.samples:,} samples of the server while creates ran")
    for title, counter in (
        ("self time", profile.self_time),
        ("inclusive time, idempay code (api/)", _api_only(profile)),
        ("self time by package", profile.packages),
    ):
        table = Table(title=f"top {n} — {title}", title_justify="left")
        table.add_column("%", justify="right")
        table.add_column("samples", justify="right")
        table.add_column("frame")
        for name, count, pct in profile.top(counter, n):
            table.add_row(f"{pct:.1f}", f"{count:,}", name)
        console.print(table)


def _api_only(profile: Profile) -> Counter[str]:
    entry_points = ("(api/cli.py)", "(api/__main__.py)")
    return Counter(
        {
            k: v
            for k, v in profile.inclusive.items()
            if "(api/" in k and not k.endswith(entry_points)
        }
    )
