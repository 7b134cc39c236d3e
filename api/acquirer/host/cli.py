"""``idempay acquirer`` — the simulated acquirer host (SPEC §2.9, §6) — and ``idempay
acquirer clearing``, its daily clearing file. Mounted by ``api/cli.py``; ``python -m
api.acquirer.host`` runs the same app (how the harnesses spawn it)."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Coroutine
from datetime import date
from pathlib import Path
from typing import Annotated, Any

import typer

from api.acquirer.host.faults import Faults

__all__ = ["app", "run_host"]

DEFAULT_STORE = Path("var") / "acquirer.sqlite3"

app = typer.Typer(
    add_completion=False,
    invoke_without_command=True,
    help="The simulated acquirer host (ISO 8583 over TCP) and its clearing file.",
)
StoreOption = Annotated[Path, typer.Option("--store", help="The host's SQLite store.")]


async def run_host(
    *,
    host: str,
    port: int,
    store: Path,
    faults: Faults,
    seed: int | None,
    slow_seconds: float,
    control_port: int | None,
) -> None:
    """Run the host until SIGTERM or SIGINT; SIGUSR1 takes it down, SIGUSR2 up."""
    from api.acquirer.host.server import AcquirerHost

    acquirer = AcquirerHost(
        host=host,
        port=port,
        store=store,
        faults=faults,
        seed=seed,
        slow_seconds=slow_seconds,
        control_port=control_port,
    )
    await acquirer.start()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    switches: set[asyncio.Task[None]] = set()

    async def set_down(down: bool) -> None:
        try:
            await acquirer.set_faults(acquirer.faults.changed({"down": down}))
        except OSError as exc:  # up, but the port was taken meanwhile: stays down
            sys.stderr.write(f"acquirer host cannot listen again: {exc}\n")

    def switch(down: bool) -> None:
        task = loop.create_task(set_down(down))
        switches.add(task)
        task.add_done_callback(switches.discard)

    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, switch, True)
    loop.add_signal_handler(signal.SIGUSR2, switch, False)
    control = (
        "" if acquirer.control_port is None else f", control 127.0.0.1:{acquirer.control_port}"
    )
    down = " (down)" if faults.down else ""
    sys.stdout.write(
        f"acquirer host listening on iso8583://{host}:{acquirer.port}{down}"
        f" (store {store}{control})\n"
    )
    sys.stdout.flush()
    await stop.wait()
    await acquirer.stop()


@app.callback()
def acquirer(
    ctx: typer.Context,
    host: Annotated[str, typer.Option(help="Interface to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to bind (0: any free port).")] = 8583,
    store: StoreOption = DEFAULT_STORE,
    control_port: Annotated[
        int | None, typer.Option(help="Loopback port of the control socket (JSON lines).")
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Seed of the faults' RNG.")] = None,
    slow_seconds: Annotated[float, typer.Option(help="tok_issuer_slow's delay.")] = 2.0,
    latency_ms: Annotated[float, typer.Option(help="Base answer latency.")] = 0.0,
    jitter_ms: Annotated[float, typer.Option(help="Plus uniform 0..jitter.")] = 0.0,
    drop_answer: Annotated[float, typer.Option(help="P(decide, never answer).")] = 0.0,
    late_answer: Annotated[float, typer.Option(help="P(answer late).")] = 0.0,
    late_seconds: Annotated[float, typer.Option(help="How late a late answer is.")] = 20.0,
    drop_connection: Annotated[float, typer.Option(help="P(close after a message).")] = 0.0,
    drop_when: Annotated[str, typer.Option(help="before | after deciding | either.")] = "either",
    down: Annotated[bool, typer.Option("--down", help="Start down (refusing).")] = False,
) -> None:
    """Run the simulated acquirer host (no sub-command), or the sub-command given."""
    if ctx.invoked_subcommand is not None:
        ctx.obj = store
        return
    from api.config import Settings
    from api.logs import configure_logging

    configure_logging(Settings())
    try:
        faults = Faults(
            latency_ms=latency_ms,
            jitter_ms=jitter_ms,
            drop_answer=drop_answer,
            late_answer=late_answer,
            late_seconds=late_seconds,
            drop_connection=drop_connection,
            drop_when=drop_when,
            down=down,
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    _run(
        run_host(
            host=host,
            port=port,
            store=store,
            faults=faults,
            seed=seed,
            slow_seconds=slow_seconds,
            control_port=control_port,
        )
    )


def _run(main: Coroutine[Any, Any, None]) -> None:
    """uvloop's loop when it is installed, asyncio's otherwise."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
        return
    uvloop.run(main)


@app.command("clearing")
def clearing(
    ctx: typer.Context,
    day: Annotated[str, typer.Option("--date", help="UTC day (the acquirer's clock).")],
    out: Annotated[Path, typer.Option("--out", help="The CSV file to write.")],
    store: Annotated[Path | None, typer.Option("--store", help="The host's store.")] = None,
) -> None:
    """Write day D's clearing file: a D row per approval that day, a T trailer."""
    from api.acquirer.host.clearing import write_clearing

    try:
        when = date.fromisoformat(day)
    except ValueError:
        raise typer.BadParameter(f"expected YYYY-MM-DD, got {day!r}", param_hint="--date") from None
    source = store or (ctx.obj if isinstance(ctx.obj, Path) else DEFAULT_STORE)
    try:
        result = write_clearing(source, day=when, out=out)
    except FileNotFoundError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    typer.echo(f"{out}: {result.record_count} records, net amount {result.net_amount}")
