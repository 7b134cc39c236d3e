"""``idempay demo``: the main job end to end on the embedded default (contract §6).

A server on embedded SQLite (or ``IDEMPAY_DATABASE_URL``), a terminal fleet through the
chaos proxy at GPRS-like loss for about a minute, the contract §8 invariants, then the lake
export of the day(s) the run touched, the Spark audit, and the headline figures with the
path of ``report.html``.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from pathlib import Path

from rich.console import Console


def _days(first: date, last: date) -> list[date]:
    return [first + timedelta(days=offset) for offset in range((last - first).days + 1)]


def run_demo(
    *, workdir: Path, terminals: int, payments: int, loss: float, console: Console
) -> bool:
    from api.cli import export_command
    from idempay_tools.cli_lake import audit_command
    from idempay_tools.simulate import FleetConfig
    from idempay_tools.simulate_run import render, run_simulation

    workdir.mkdir(parents=True, exist_ok=True)
    lake, out = workdir / "lake", workdir / "audit"
    console.rule("1/3 · a terminal fleet through the chaos proxy")
    started = datetime.now(UTC).date()
    config = FleetConfig(
        base_url="",
        api_key="",
        workdir=workdir / "terminals",
        terminals=terminals,
        payments=payments,
        loss=loss,
        via_proxy=True,
        seed=7,
    )
    result, report = run_simulation(config, start=True, console=console)
    console.print(render(config, result, report))
    if not report.ok:
        console.print(f"[red]invariants failed: {', '.join(report.failed())}[/]")
        return False
    console.print("[green]contract §8 invariants hold: 0 duplicates, 0 lost[/]")

    console.rule("2/3 · export to the Parquet lake")
    days = _days(started, datetime.now(UTC).date())
    for day in days:
        export_command(day=day.isoformat(), lake_dir=lake)

    console.rule("3/3 · the Spark audit")
    audit_command(
        start=days[0].isoformat(), end=days[-1].isoformat(), lake_dir=lake, out=out, master=None
    )
    console.print(f"\n[bold]finance report:[/] {(out / 'report.html').resolve()}")
    return True
