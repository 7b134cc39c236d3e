"""``idempay audit``, ``idempay lake synth`` and ``idempay lake add-clearing`` (contract
§5–6); ``idempay export`` is the server's (``api/cli.py``).

Registered by ``idempay_tools/cli.py``. pyspark and the analytics package are imported
inside the commands, so ``idempay --help`` never starts a JVM or loads Arrow.
"""

from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import asdict
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from api.cli import LakeOption, parse_day

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from rich.progress import Progress, TaskID

    from analytics.clearing import Landed

lake = typer.Typer(no_args_is_help=True, help="The Parquet lake the audit reads.")


def _watch_spark(
    spark: SparkSession, progress: Progress, task: TaskID, done: threading.Event
) -> None:
    """Mirror Spark's active stages into the progress bar until ``done``."""
    tracker = spark.sparkContext.statusTracker()
    while not done.wait(0.25):
        completed = total = 0
        stages = tracker.getActiveStageIds()
        for stage_id in stages:
            info = tracker.getStageInfo(stage_id)
            if info is not None:
                completed += info.numCompletedTasks
                total += info.numTasks
        progress.update(
            task, completed=completed, total=total or None, spark=f"{len(stages)} stage(s)"
        )


def audit_command(
    start: Annotated[str, typer.Option("--from", help="First UTC day, YYYY-MM-DD (inclusive).")],
    end: Annotated[str, typer.Option("--to", help="Last UTC day, YYYY-MM-DD (inclusive).")],
    lake_dir: LakeOption,
    out: Annotated[Path, typer.Option("--out", help="Output directory.")],
    master: Annotated[
        str | None, typer.Option("--master", help="Spark master (default local[*]).")
    ] = None,
    strict: Annotated[
        bool,
        typer.Option(
            "--strict", help="Exit 1 when the lake has any warning or the settlement any exception."
        ),
    ] = False,
) -> None:
    """The Spark audit over --from..--to: daily summary, rankings, suspects, report.html."""
    from pyspark.sql import SparkSession
    from rich.console import Console
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from analytics.html_table import percent
    from analytics.jobs.daily_audit import describe, describe_exception, run_audit
    from analytics.session import build_session

    first, last = parse_day(start, "--from"), parse_day(end, "--to")
    if last < first:
        raise typer.BadParameter("--to is before --from", param_hint="--to")
    console = Console()
    started = time.perf_counter()
    owned = SparkSession.getActiveSession() is None
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} tasks · {task.fields[spark]}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task("starting Spark", total=None, spark="")
        spark = build_session(master)
        done = threading.Event()
        watcher = threading.Thread(
            target=_watch_spark, args=(spark, progress, task, done), daemon=True
        )
        watcher.start()
        try:
            result = run_audit(
                spark,
                lake=str(lake_dir),
                out=out,
                start=first,
                end=last,
                on_stage=lambda stage: progress.update(task, description=stage),
            )
        finally:
            done.set()
            watcher.join()
            if owned:
                spark.stop()
    headline = result.headline
    table = Table(title=f"idempay audit {first} – {last}", show_header=False)
    for name, value in headline.items():
        shown = percent(value) if name.endswith("_rate") else f"{value:,}"
        money = name in ("exactly_once_violations", "settlement_exceptions")
        style = "bold red" if money and value else ""
        table.add_row(name, f"[{style}]{shown}[/]" if style else shown)
    console.print(table)
    console.print(f"audit took {time.perf_counter() - started:.1f} s; outputs in {result.out}")
    console.print(f"report: {result.report}")
    if headline["exactly_once_violations"]:
        console.print("[bold red]exactly-once violations found: see the report's banner[/]")
    for warning in result.warnings:
        console.print(describe(warning), style="bold yellow", markup=False, highlight=False)
    for note in result.notes:  # not damage (an older schema's partition): --strict ignores
        console.print(describe(note, what="lake note"), markup=False, highlight=False)
    for exception in result.exceptions:
        console.print(describe_exception(exception), style="bold red", markup=False)
    if strict and (result.warnings or result.exceptions):
        raise typer.Exit(1)


@lake.command("synth")
def synth_command(
    lake_dir: LakeOption,
    days: Annotated[int, typer.Option(min=1, help="Days to generate.")] = 7,
    events_per_day: Annotated[
        int, typer.Option(min=1, help="Request events per day (about).")
    ] = 10_000,
    seed: Annotated[int, typer.Option(help="Random seed (same seed, same lake).")] = 1,
    start: Annotated[
        str | None, typer.Option(help="First UTC day (default: --days before today).")
    ] = None,
    merchants: Annotated[int, typer.Option(min=1, help="Merchants in the fleet.")] = 4,
    terminals: Annotated[int, typer.Option(min=1, help="Terminals per merchant.")] = 30,
    violations: Annotated[
        int, typer.Option(min=0, help="Plant this many duplicate charges (red banner demo).")
    ] = 0,
) -> None:
    """Write a realistic synthetic lake: a terminal fleet on lossy links, with client bugs."""
    from analytics.synth import SynthConfig, synthesize

    first = (
        parse_day(start, "--start") if start else datetime.now(UTC).date() - timedelta(days=days)
    )
    config = SynthConfig(
        lake=lake_dir,
        days=days,
        events_per_day=events_per_day,
        seed=seed,
        start=first,
        merchants=merchants,
        terminals_per_merchant=terminals,
        violations=violations,
    )
    started = time.perf_counter()
    result = synthesize(config)
    last = first + timedelta(days=days - 1)
    typer.echo(
        f"{result.events} request events, {result.transactions} transactions, "
        f"{result.ledger_entries} ledger entries for {first} – {last} in "
        f"{time.perf_counter() - started:.1f} s → {lake_dir}"
    )
    typer.echo(
        f"planted: {len(result.planted_double_charges)} new-key double charges, "
        f"{result.planted_violations} exactly-once violations, "
        f"{len(result.planted_offline)} offline sales "
        f"({sum(s.declined for s in result.planted_offline)} declined, "
        f"{sum(s.forwarded_after_day_end for s in result.planted_offline)} forwarded after "
        f"day end), {len(result.planted_blocks)} duplicate-guard blocks, "
        f"{len(result.planted_overrides)} overrides"
    )


def land_clearing_file(
    path: Path, lake_dir: Path, *, day: date | None = None, replace: bool = False
) -> Landed:
    """Validate an acquirer clearing file (header, trailer count and net amount: the
    acquirer's own reader) and land it as ``clearing/clearing_date=D/``. Raises
    ``ClearingFileError`` or ``ClearingRefusedError``; nothing is landed then."""
    from analytics.clearing import from_records, land
    from api.acquirer.host.clearing import read_clearing

    clearing = read_clearing(path)
    rows = from_records([asdict(record) for record in clearing.records])
    return land(
        lake_dir,
        rows,
        record_count=clearing.record_count,
        net=clearing.net_amount,
        source_sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
        source_name=path.name,
        day=day,
        replace=replace,
    )


@lake.command("add-clearing")
def add_clearing_command(
    file: Annotated[Path, typer.Argument(help="The acquirer's clearing file (CSV).")],
    lake_dir: LakeOption,
    day: Annotated[
        str | None,
        typer.Option("--date", help="The clearing day, YYYY-MM-DD (default: the rows' day)."),
    ] = None,
    replace: Annotated[
        bool, typer.Option("--replace", help="Replace another file already landed for the day.")
    ] = False,
) -> None:
    """Land the acquirer's clearing file in the lake, once its trailer checks out."""
    from analytics.clearing import ClearingRefusedError
    from api.acquirer.host.clearing import ClearingFileError

    stated = parse_day(day, "--date") if day else None
    if not file.is_file():
        raise typer.BadParameter(f"no such file: {file}", param_hint="FILE")
    try:
        landed = land_clearing_file(file, lake_dir, day=stated, replace=replace)
    except (ClearingFileError, ClearingRefusedError) as exc:
        where = "" if isinstance(exc, ClearingFileError) else f"{file}: "  # it names the file
        typer.echo(f"refused: {where}{exc} — nothing landed", err=True)
        raise typer.Exit(1) from None
    said = {
        "landed": "landed",
        "replaced": "replaced the day's earlier file with",
        "unchanged": "already landed, unchanged:",
    }[landed.outcome]
    typer.echo(
        f"{said} {file.name} → {landed.path.parent} ({landed.rows} records, "
        f"net amount {landed.net_amount})"
    )
