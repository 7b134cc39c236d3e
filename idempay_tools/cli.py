"""``idempay``: one entry point to everything (contract §6).

The server's app (``api/cli.py``: serve, migrate, admin, relay, completer, purge, export,
acquirer) mounted as is, plus the tooling's commands: ``simulate``, ``demo``, ``audit``,
``lake synth`` and ``lake add-clearing``. The heavy imports (the SDK, Spark, rich) happen
inside the commands.
"""

from __future__ import annotations

from typing import Annotated

import typer

from api.cli import app as server_app
from idempay_tools.cli_lake import audit_command, lake

app = typer.Typer(no_args_is_help=True, add_completion=False, help="idempay command line.")
# The server's commands and groups, at the top level as before (not under a sub-command).
app.registered_commands.extend(server_app.registered_commands)
app.registered_groups.extend(server_app.registered_groups)
app.command("audit")(audit_command)
app.add_typer(lake, name="lake")


@app.command()
def simulate(
    terminals: Annotated[int, typer.Option(min=1, help="Concurrent terminals.")] = 20,
    payments: Annotated[int, typer.Option(min=1, help="Payments per terminal.")] = 100,
    loss: Annotated[float, typer.Option(min=0.0, max=1.0, help="Link fault rate.")] = 0.035,
    via_proxy: Annotated[
        bool, typer.Option("--via-proxy", help="Faults from the chaos proxy, not the transport.")
    ] = False,
    kill_clients: Annotated[
        bool, typer.Option("--kill-clients", help="SIGKILL some terminal processes mid-run.")
    ] = False,
    reboot_terminals: Annotated[
        bool,
        typer.Option(
            "--reboot-terminals",
            help="Terminals die mid-payment and reboot; the cashier re-runs the sale.",
        ),
    ] = False,
    url: Annotated[str | None, typer.Option(help="A running server (default: start one).")] = None,
    api_key: Annotated[str | None, typer.Option(help="API key for --url.")] = None,
    seed: Annotated[int, typer.Option(help="Seed for faults, cards and jitter.")] = 1,
    outage: Annotated[
        float,
        typer.Option(
            min=0.0,
            help="Seconds the link is fully down for half the fleet (every terminal sells "
            "under an offline policy: stored, then forwarded exactly once).",
        ),
    ] = 0.0,
    slow_share: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Share of tok_issuer_slow cards.")
    ] = 0.0,
    workdir: Annotated[
        str | None, typer.Option(help="Where the journals go (default: a temp dir).")
    ] = None,
    acquirer_faults: Annotated[
        str,
        typer.Option(
            help="Faults of the acquirer host started for the run, NAME=VALUE,… (e.g. "
            "drop_answer=0.02,late_answer=0.02; names: latency_ms, jitter_ms, drop_answer, "
            "late_answer, late_seconds, drop_connection, drop_when, down).",
        ),
    ] = "",
    acquirer_store: Annotated[
        str | None,
        typer.Option(help="With --url: the acquirer host's store, for the acquirer checks."),
    ] = None,
) -> None:
    """A terminal fleet through the SDK on a lossy link, with the simulated acquirer host as
    a process of its own, then the contract §8 invariants from both sides (through the chaos
    proxy, also the audit's link loss against the proxy's count)."""
    from pathlib import Path

    from rich.console import Console

    from idempay_tools.simulate import FleetConfig
    from idempay_tools.simulate_links import render_link_check
    from idempay_tools.simulate_run import (
        default_workdir,
        describe,
        parse_acquirer_faults,
        render,
        run_simulation,
    )

    if (url is None) != (api_key is None):
        raise typer.BadParameter("--url and --api-key go together")
    if url is not None and acquirer_faults:
        raise typer.BadParameter("--acquirer-faults is for the host a run starts (not --url)")
    try:
        faults = parse_acquirer_faults(acquirer_faults)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--acquirer-faults") from None
    config = FleetConfig(
        base_url=url or "",
        api_key=api_key or "",
        workdir=Path(workdir) if workdir else default_workdir(),
        terminals=terminals,
        payments=payments,
        loss=loss,
        via_proxy=via_proxy,
        kill_clients=kill_clients,
        reboot_terminals=reboot_terminals,
        seed=seed,
        slow_share=slow_share,
        outage_s=outage,
    )
    console = Console()
    result, report = run_simulation(
        config,
        start=url is None,
        console=console,
        audit_links=True,
        acquirer_faults=faults,
        acquirer_store=Path(acquirer_store) if acquirer_store else None,
    )
    console.print(describe(config, result), soft_wrap=True)
    console.print(render(config, result, report))
    for violation in report.violations:
        console.print(f"[red]{violation.invariant}[/] {violation.key or ''} {violation.detail}")
    if result.link_loss is not None:
        console.print(render_link_check(result.link_loss), markup=False, highlight=False)
    if not report.ok:
        console.print(f"[red]invariants failed: {', '.join(report.failed())}[/]")
        raise typer.Exit(1)
    console.print("[green]all invariants hold[/]")
    if result.link_loss is not None and not result.link_loss.ok:
        console.print("[red]the audit's link loss disagrees with the chaos proxy's count[/]")
        raise typer.Exit(1)


@app.command()
def demo(
    terminals: Annotated[int, typer.Option(min=1, help="Concurrent terminals.")] = 10,
    payments: Annotated[int, typer.Option(min=1, help="Payments per terminal.")] = 400,
    loss: Annotated[float, typer.Option(min=0.0, max=1.0, help="Link fault rate.")] = 0.035,
    workdir: Annotated[
        str, typer.Option(help="Where the demo writes: a folder per run, `latest` the last.")
    ] = "var/demo",
) -> None:
    """The main job end to end: server, fleet on a lossy link, export, audit, report."""
    from pathlib import Path

    from rich.console import Console

    from idempay_tools.demo import new_run_dir, run_demo

    console = Console()
    run = new_run_dir(Path(workdir))
    console.print(f"this run's folder: {run}")
    if not run_demo(
        workdir=run,
        terminals=terminals,
        payments=payments,
        loss=loss,
        console=console,
    ):
        raise typer.Exit(1)
    stable = Path(workdir) / "latest" / "audit" / "report.html"
    console.print(f"the last run's report, always here: {stable}")


def main() -> None:
    app()
