"""``idempay demo``: the main job end to end on the embedded default (contract §6).

The simulated acquirer host as a process of its own and a server on embedded SQLite (or
``IDEMPAY_DATABASE_URL``) speaking ISO 8583 to it, a terminal fleet through the chaos proxy
at GPRS-like loss, the contract §8 invariants from both sides (the database and journals,
and — once the reversal-advice queue has drained — the acquirer's own store: at most one
0200 per key, its net approvals equal to the approved transactions by RRN), then a week in
the lake: six
past days synthesized (``analytics.synth``, the fleet's volume) and the day(s) the run
touched exported from the database, the acquirer's clearing file of each of the fleet's
days written from its store and landed (the synthesized days come with theirs); the Spark
audit over the seven days (so the report's trend charts are trends) with the settlement
reconciliation (0 exceptions expected), the audit's link loss checked against the chaos proxy's own
count of the creates it lost (``idempay_tools.simulate_links``), and the path of
``report.html``.
"""

from __future__ import annotations

import csv
import os
import secrets
import shutil
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

from rich.console import Console

PAST_DAYS = 6
KEPT_RUNS = 3  # the demo's older run folders are removed


def new_run_dir(root: Path) -> Path:
    """A folder of this run's own under ``root/runs`` — its database (embedded SQLite,
    unless ``IDEMPAY_DATABASE_URL`` names another), terminals' journals, acquirer store, lake
    and report — so runs in a row never read each other's keys and never touch what
    ``idempay serve`` uses; ``root/latest`` points at it (the report's stable path is
    ``root/latest/audit/report.html``). Only the last ``KEPT_RUNS`` runs are kept."""
    runs = root / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    run = runs / f"{stamp}-{secrets.token_hex(2)}"
    run.mkdir()
    os.environ["IDEMPAY_VAR_DIR"] = str((run / "var").resolve())  # the server and the checks
    latest = root / "latest"
    if latest.is_symlink() or latest.exists():
        latest.unlink()
    latest.symlink_to(Path("runs") / run.name, target_is_directory=True)
    for old in sorted(p for p in runs.iterdir() if p.is_dir())[:-KEPT_RUNS]:
        shutil.rmtree(old, ignore_errors=True)
    return run


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
    stages: list[tuple[str, float]] = []
    clock = time.monotonic()

    def lap(name: str) -> None:
        nonlocal clock
        now = time.monotonic()
        stages.append((name, now - clock))
        clock = now

    console.rule("1/4 · a terminal fleet through the chaos proxy, the acquirer across ISO 8583")
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
    if report.acquirer is not None:
        acquirer = report.acquirer
        console.print(
            f"[green]the acquirer agrees: {acquirer.requests} 0200s for {acquirer.rrns} RRNs "
            f"(at most one per key), net approvals {acquirer.net_approvals} = approved "
            f"transactions {acquirer.approved}, {acquirer.advices} reversal advices all "
            "acknowledged[/]"
        )

    lap("fleet")
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
    if report.acquirer is not None:
        _land_clearing(Path(report.acquirer.store), days, workdir / "clearing", lake, console)

    lap("lake")
    console.rule("3/4 · the Spark audit")
    audit_command(
        start=first.isoformat(), end=days[-1].isoformat(), lake_dir=lake, out=out, master=None
    )
    report_path = (out / "report.html").resolve()

    lap("audit")
    console.rule("4/4 · link loss: the audit against the chaos proxy")
    assert result.link is not None and result.merchant_id is not None
    check = check_link_loss(
        result.link, result.outcomes, audit_out=out, merchant_id=result.merchant_id
    )
    console.print(render_link_check(check), markup=False, highlight=False)
    settled = _settlement_exceptions(out, console)
    lap("checks")
    split = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in stages)
    console.print(f"time: {sum(s for _, s in stages):.0f} s ({split})")
    console.print(f"\n[bold]finance report, {first} – {days[-1]}:[/] {report_path}")
    if not check.ok:
        console.print("[red]the audit's link loss disagrees with the chaos proxy's count[/]")
    return check.ok and settled


def _land_clearing(
    store: Path, days: list[date], folder: Path, lake: Path, console: Console
) -> None:
    """The acquirer's clearing file of each day the fleet ran, written from its store (the
    advice queue has drained) and landed in the lake as ``idempay lake add-clearing`` does;
    the synthesized days have theirs from the synthesis."""
    from api.acquirer.host.clearing import write_clearing
    from idempay_tools.cli_lake import land_clearing_file

    for day in days:
        path = folder / f"clearing-{day.isoformat()}.csv"
        write_clearing(store, day=day, out=path)
        landed = land_clearing_file(path, lake, day=day)
        console.print(
            f"acquirer clearing {day}: {landed.rows} records, net amount "
            f"{landed.net_amount:,} → {landed.path.parent}"
        )


def _settlement_exceptions(out: Path, console: Console) -> bool:
    """The reconciliation's verdict from the audit's outputs: True when 0 exceptions."""
    with (out / "settlement_recon.csv").open(newline="") as handle:
        fleet = [r for r in csv.DictReader(handle) if r["merchant_id"] == "ALL"]
    with (out / "settlement_exceptions.csv").open(newline="") as handle:
        exceptions = list(csv.DictReader(handle))
    matched = sum(int(r["matched"]) for r in fleet)
    style = "red" if exceptions else "green"
    console.print(
        f"[{style}]settlement against the acquirer's clearing: {matched:,} matched over "
        f"{len(fleet)} days, {len(exceptions)} exceptions[/]"
    )
    return not exceptions
