"""``idempay demo``: the main job end to end on the embedded default (contract §6).

A server on embedded SQLite (or ``IDEMPAY_DATABASE_URL``), a terminal fleet through the
chaos proxy at GPRS-like loss, the contract §8 invariants, then a week in the lake: six
past days synthesized (``analytics.synth``, the fleet's volume) and the day(s) the run
touched exported from the database; the Spark audit over the seven days (so the report's
trend charts are trends), the audit's link loss checked against the chaos proxy's own
count of the creates it lost (``idempay_tools.simulate_links``), and the path of
``report.html``.
"""

from __future__ import annotations

import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

from rich.console import Console

PAST_DAYS = 6
EVENTS_PER_PAYMENT = 1.15  # about what a fleet at 3.5 % loss records per payment


def run_demo(
    *, workdir: Path, terminals: int, payments: int, loss: float, console: Console
) -> bool:
    from analytics.synth import SynthConfig, synthesize
    from api.cli import export_command
    from idempay_tools.cli_lake import audit_command
    from idempay_tools.simulate import FleetConfig
    from idempay_tools.simulate_links import check_link_loss, days_between, render_link_check
    from idempay_tools.simulate_run import render, run_simulation

    workdir.mkdir(parents=True, exist_ok=True)
    lake, out = workdir / "lake", workdir / "audit"
    console.rule("1/4 · a terminal fleet through the chaos proxy")
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

    console.rule(f"2/4 · the lake: {PAST_DAYS} synthesized past days, then the fleet's day")
    days = days_between(started, datetime.now(UTC).date())
    first = days[0] - timedelta(days=PAST_DAYS)
    shutil.rmtree(lake, ignore_errors=True)  # this run's week, nothing older
    # Before the export: payments of the last synthesized day that run past midnight land
    # in the fleet's day, and the export merges the database's rows with them.
    synth = synthesize(
        SynthConfig(
            lake=lake,
            days=PAST_DAYS,
            events_per_day=round(terminals * payments * EVENTS_PER_PAYMENT),
            seed=7,
            start=first,
        )
    )
    console.print(
        f"synthesized {first} – {days[0] - timedelta(days=1)}: {synth.events:,} request "
        f"events, {synth.transactions:,} transactions"
    )
    for day in days:
        export_command(day=day.isoformat(), lake_dir=lake)

    console.rule("3/4 · the Spark audit")
    audit_command(
        start=first.isoformat(), end=days[-1].isoformat(), lake_dir=lake, out=out, master=None
    )
    report_path = (out / "report.html").resolve()

    console.rule("4/4 · link loss: the audit against the chaos proxy")
    assert result.link is not None and result.merchant_id is not None
    check = check_link_loss(
        result.link, result.outcomes, audit_out=out, merchant_id=result.merchant_id
    )
    console.print(render_link_check(check), markup=False, highlight=False)
    console.print(f"\n[bold]finance report, {first} – {days[-1]}:[/] {report_path}")
    if not check.ok:
        console.print("[red]the audit's link loss disagrees with the chaos proxy's count[/]")
    return check.ok
