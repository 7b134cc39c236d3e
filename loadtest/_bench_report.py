"""Figures from the rounds: medians, pooled percentiles, CPU split, ratios, goals, tables."""

from __future__ import annotations

import statistics
from collections import Counter
from typing import Any

from rich.console import Console
from rich.table import Table

from loadtest._bench_layers import LAYERS
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
    return float(
        statistics.median(r[key] / r["cpu"]["wall_s"] for r in rounds if r["cpu"]["wall_s"] > 0)
    )


def summarize(rounds: list[dict[str, Any]], latencies: list[float]) -> dict[str, Any]:
    """One scenario's figures from its rounds (``rate`` is req/s, or tps for pgbench)."""
    rates = [r["rate"] for r in rounds]
    requests = sum(r["requests"] for r in rounds)
    errors = sum(r["errors"] for r in rounds)
    for r in rounds:
        cpu = r["cpu"]
        r["generator_s"] = r["generator_cpu_s"]
        r["server_s"], r["postgres_s"] = cpu["server_s"], cpu["postgres_s"]
        r["acquirer_s"] = cpu.get("acquirer_s", 0.0)
        r["other_s"] = max(
            0.0,
            cpu["machine_s"]
            - r["generator_s"]
            - cpu["server_s"]
            - cpu["postgres_s"]
            - r["acquirer_s"],
        )
    ordered = sorted(latencies)
    statuses: dict[str, int] = {}
    for r in rounds:
        for label, count in r.get("statuses", {}).items():
            statuses[label] = statuses.get(label, 0) + count
    server_us = {r["round"]: 1e6 * r["server_s"] / r["requests"] for r in rounds if r["requests"]}
    per_request = {
        f"{part}_us_per_req": 1e6 * sum(r[f"{part}_s"] for r in rounds) / max(requests, 1)
        for part in ("generator", "server", "postgres", "acquirer")
    }
    commits = [r["group_commit"] for r in rounds if "group_commit" in r]
    writes_per_commit = {
        kind: sum(c[f"{kind}_writes"] for c in commits)
        / max(1.0, sum(c[f"{kind}_transactions"] for c in commits))
        for kind in ("claim", "finish")
        if commits
    }
    return {
        "writes_per_commit": writes_per_commit,
        "rate_median": statistics.median(rates),
        "rate_min": min(rates),
        "rate_max": max(rates),
        "rates": {r["round"]: r["rate"] for r in rounds},  # by round number, for pairing
        "server_us": server_us,
        "p50_ms": percentile(ordered, 50),
        "p99_ms": percentile(ordered, 99),
        "latency_source": "pooled per-request" if latencies else "",
        "requests": requests,
        "errors": errors,
        "error_pct": 100.0 * errors / max(requests, 1),
        "statuses": statuses,
        "cores": {
            p: _cores(rounds, f"{p}_s")
            for p in ("generator", "server", "postgres", "acquirer", "other")
        },
        **per_request,
    }


def _paired(top: dict[int, float], bottom: dict[int, float]) -> list[float]:
    """top ÷ bottom for every round both were measured in."""
    return [top[n] / bottom[n] for n in sorted(top.keys() & bottom.keys()) if bottom[n]]


def ratios(figures: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Ratios measured pairwise: the median over rounds of (top ÷ bottom in that round).

    Both scenarios of a pair ran back to back in every round, so the paired ratio cancels
    the machine's slow drift; the ratio of the two medians is kept for reference.
    """
    pairs = [
        ("create ÷ bypassed", "create", "bypassed", "rates"),
        ("replay ÷ create", "replay", "create", "rates"),
        ("lookup ÷ create", "lookup", "create", "rates"),
        ("replay with Redis ÷ replay", "replay+redis", "replay", "rates"),
        ("replay with Redis ÷ create", "replay+redis", "create", "rates"),
        ("lookup with Redis ÷ lookup", "lookup+redis", "lookup", "rates"),
        ("create ÷ pgbench", "create", "pgbench", "rates"),
        ("pgbench ÷ pgbench-no-outbox", "pgbench", "pgbench-no-outbox", "rates"),
        ("server CPU per request, bypassed ÷ create", "bypassed", "create", "server_us"),
    ]
    out: dict[str, dict[str, Any]] = {}
    for name, top, bottom, series in pairs:
        if top not in figures or bottom not in figures:
            continue
        per_round = _paired(figures[top][series], figures[bottom][series])
        if series == "server_us":  # a cost, not a rate: the cheaper path's cost on top
            of_medians = figures[top]["server_us_per_req"] / figures[bottom]["server_us_per_req"]
        else:
            of_medians = figures[top]["rate_median"] / figures[bottom]["rate_median"]
        if not per_round:
            continue
        entry: dict[str, Any] = {
            "value": statistics.median(per_round),
            "round_min": min(per_round),
            "round_max": max(per_round),
            "of_medians": of_medians,
        }
        if name in GOALS:
            entry["goal"] = f"≥ {GOALS[name]:g}"
            entry["met"] = entry["value"] >= GOALS[name]
        out[name] = entry
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
    table.add_column("CPU cores gen/srv/pg/acq/other", justify="right")
    table.add_column("CPU µs/req srv/pg/acq", justify="right")
    table.add_column("writes/commit claim/finish", justify="right")
    for name, f in figures.items():
        cores = f["cores"]
        is_pg = name.startswith("pgbench")
        table.add_row(
            name + (f" (tps, -c {_span(f['clients'])})" if is_pg else ""),
            f"{f['rate_median']:,.0f}",
            f"{f['rate_min']:,.0f}–{f['rate_max']:,.0f}",
            "—" if is_pg else f"{f['p50_ms']:.1f}",
            f"avg {f['latency_avg_ms']:.1f}" if is_pg else f"{f['p99_ms']:.1f}",
            f"{f['requests']:,}",
            f"{f['errors']} ({f['error_pct']:.2f} %)",
            " / ".join(
                f"{cores[p]:.2f}" for p in ("generator", "server", "postgres", "acquirer", "other")
            ),
            ("—" if is_pg else f"{f['server_us_per_req']:,.0f}")
            + f" / {f['postgres_us_per_req']:,.0f} / {f['acquirer_us_per_req']:,.0f}",
            " / ".join(f"{v:.1f}" for v in f.get("writes_per_commit", {}).values()) or "—",
        )
    console.print(table)
    goals = Table(
        title="ratios: median of per-round ratios (each round runs both back to back)",
        title_justify="left",
    )
    for header in ("figure", "paired", "per-round range", "of medians", "goal", "status"):
        goals.add_column(header, justify="left" if header == "figure" else "right")
    for name, d in derived.items():
        ranged = f"{d['round_min']:.2f}–{d['round_max']:.2f}" if "round_min" in d else ""
        of_medians = f"{d['of_medians']:.2f}" if "of_medians" in d else ""
        met = d.get("met")
        status = "" if met is None else ("[green]met[/]" if met else "[red]missed[/]")
        value = f"{d['value']:.2f}" if "round_min" in d else f"{d['value']:.1f}"
        goals.add_row(name, value, ranged, of_medians, d.get("goal", ""), status)
    if "pgbench" not in figures:
        goals.add_row("create ÷ pgbench", "—", "", "", "", context.get("pgbench_note", ""))
    console.print(goals)
    waits = Table(
        title="Postgres backends of the bench database: mean per 50 ms sample (idle left out)",
        title_justify="left",
    )
    waits.add_column("scenario")
    waits.add_column("busiest states")
    for name, states in context.get("waits", {}).items():
        waits.add_row(name, ", ".join(f"{label} {mean:.1f}" for label, mean in states))
    console.print(waits)


def _span(values: list[int]) -> str:
    return f"{min(values)}–{max(values)}" if min(values) != max(values) else str(values[0])


def render_profile(console: Console, profile: Profile, n: int = 15) -> None:
    console.print(f"py-spy: {profile.samples:,} samples of the server while creates ran")
    for title, counter in (
        ("self time", profile.self_time),
        ("inclusive time, idempay code (api/)", _api_only(profile)),
        ("self time by package", profile.packages),
        ("SQLAlchemy's self time by what it was doing", profile.sqlalchemy),
    ):
        table = Table(title=f"top {n} — {title}", title_justify="left")
        table.add_column("%", justify="right")
        table.add_column("samples", justify="right")
        table.add_column("frame")
        for name, count, pct in profile.top(counter, n):
            table.add_row(f"{pct:.1f}", f"{count:,}", name)
        console.print(table)
    _render_layers(console, profile)
    if profile.gc is not None:
        _render_gc(console, profile.gc)


def _render_layers(console: Console, profile: Profile) -> None:
    """Samples per layer of the request path, and CPU µs per create when it was measured."""
    cpu = profile.cpu_us_per_create
    title = "self time by layer (loadtest/_bench_layers.py)"
    if cpu is not None:
        title += f" — server CPU {cpu:,.0f} µs per create under py-spy"
    table = Table(title=title, title_justify="left")
    table.add_column("%", justify="right")
    table.add_column("samples", justify="right")
    if cpu is not None:
        table.add_column("µs/create", justify="right")
    table.add_column("layer")
    for name, count, pct in profile.top(profile.layers, len(LAYERS)):
        share = [f"{cpu * pct / 100.0:,.0f}"] if cpu is not None else []
        table.add_row(f"{pct:.1f}", f"{count:,}", *share, name)
    console.print(table)


def _render_gc(console: Console, gc: dict[str, Any]) -> None:
    """The collector's pauses in py-spy's window (loadtest/_gc_trace.py's summary)."""
    seconds = gc["seconds"]
    table = Table(
        title=f"GC pauses in the server over {seconds:.1f} s (threshold {gc['threshold']}, "
        f"{gc['frozen']:,} objects frozen)",
        title_justify="left",
    )
    for column in ("generation", "collections", "total ms", "% of the window", "longest ms"):
        table.add_column(column, justify="right")
    table.add_column("> 5 ms", justify="right")
    for generation, row in gc["generations"].items():
        share = 100.0 * row["total_ms"] / (1000.0 * seconds) if seconds else 0.0
        table.add_row(
            generation,
            f"{row['count']:,.0f}",
            f"{row['total_ms']:,.1f}",
            f"{share:.2f}",
            f"{row['max_ms']:.2f}",
            f"{row['over_5ms']:,.0f}",
        )
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
