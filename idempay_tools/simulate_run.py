"""``idempay simulate`` and ``idempay demo``'s fleet step: start a server (unless a URL is
given), mint a merchant key, run the fleet (``idempay_tools.simulate``), check contract §8
(``idempay_tools.invariants``) and render the run as a rich table; through the chaos proxy,
also the audit's link loss against the proxy's own tally (``idempay_tools.simulate_links``)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from idempay_tools.serve_process import ServerProcess
from idempay_tools.simulate import FleetConfig, FleetResult, run_fleet
from idempay_tools.simulate_links import audit_run, check_link_loss, days_between

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from idempay_tools.invariants import InvariantReport

__all__ = ["default_workdir", "describe", "render", "run_simulation", "start_server"]


@contextlib.contextmanager
def start_server(log_path: Path, *, timeout: float = 60.0) -> Iterator[str]:
    """``python -m api serve`` on a free loopback port (configured database); its URL."""
    env = {  # a fleet at full speed, not terminals' real pace (unless the caller set them)
        name: os.environ.get(name, "100000/second")
        for name in ("IDEMPAY_RATE_LIMIT", "IDEMPAY_RATE_LIMIT_TERMINAL")
    }
    server = ServerProcess(env, log_path)
    try:
        yield server.start(timeout=timeout).url
    finally:
        server.stop()


async def _new_api_key(merchant: str) -> str:
    from api.auth import create_api_key
    from api.config import Settings
    from api.db import create_engine

    engine = create_engine(Settings())
    try:
        return await create_api_key(engine, merchant)
    finally:
        await engine.dispose()


async def _check(api_key: str, result: FleetResult) -> InvariantReport:
    from api.config import Settings
    from api.db import create_engine
    from idempay_tools.invariants import check_invariants, merchant_for_api_key

    engine = create_engine(Settings())
    try:
        merchant = await merchant_for_api_key(engine, api_key)
        if merchant is None:
            raise RuntimeError("the API key is not in the configured database (IDEMPAY_*)")
        result.merchant_id = merchant
        return await check_invariants(
            engine, merchant_ids=[merchant], reported=result.outcomes, journals=result.journals
        )
    finally:
        await engine.dispose()


def run_simulation(
    config: FleetConfig, *, start: bool, console: Console, audit_links: bool = False
) -> tuple[FleetResult, InvariantReport]:
    """Start a server (when ``start``) and a merchant key, run the fleet, check §8.

    ``audit_links`` (through the proxy, on a server started here): once the server has
    stopped (every request event flushed), export the run's days to ``WORKDIR/lake``, run
    the Spark audit into ``WORKDIR/audit`` and compare its link loss with the proxy's
    tally (``result.link_loss``); not with ``outage_s``, whose refused connections never
    reach the proxy."""
    from rich.console import Console

    if not start:
        console.print(f"server {config.base_url} · journals in {config.workdir}")
        result = run_fleet(config, console=Console(stderr=True))
        return result, asyncio.run(_check(config.api_key, result))
    config.workdir.mkdir(parents=True, exist_ok=True)
    first = datetime.now(UTC).date()
    with start_server(config.workdir / "server.log") as url:
        api_key = asyncio.run(_new_api_key(f"simulate-{uuid.uuid4().hex[:12]}"))
        console.print(f"server {url} · journals in {config.workdir}")
        config = replace(config, base_url=url, api_key=api_key)
        result = run_fleet(config, console=Console(stderr=True))
        report = asyncio.run(_check(api_key, result))
    if audit_links and result.link is not None and config.outage_s:
        # The outage refuses connections in the terminals' own transport, before the proxy:
        # attempts lost there are link loss the audit sees and the proxy never counted.
        console.print("link loss not checked against the proxy: --outage drops before it")
    elif audit_links and result.link is not None and result.merchant_id is not None:
        lake, out = config.workdir / "lake", config.workdir / "audit"
        console.print(f"exporting the run and auditing it (Spark) → {out}")
        audit_run(lake, out, days_between(first, datetime.now(UTC).date()))
        result.link_loss = check_link_loss(
            result.link, result.outcomes, audit_out=out, merchant_id=result.merchant_id
        )
    return result, report


def default_workdir() -> Path:
    return Path(tempfile.mkdtemp(prefix="idempay-simulate-"))


def describe(config: FleetConfig, result: FleetResult) -> str:
    link = "chaos proxy" if config.via_proxy else "fault transport"
    rebooting = config.kill_clients or config.reboot_terminals
    killed = f", {result.killed} killed and rebooted" if rebooting else ""
    outage = (
        f", link down {config.outage_s:g} s for {config.outage_share:.0%} of the fleet"
        if config.outage_s
        else ""
    )
    return (
        f"{config.terminals} terminals × {config.payments} payments, "
        f"loss {config.loss:.1%} via {link}{killed}{outage}, {result.elapsed_s:.1f} s"
    )


def render(config: FleetConfig, result: FleetResult, report: InvariantReport) -> Table:
    """The run as a table: outcomes, round trips, and each contract §8 invariant."""
    from rich.table import Table

    tally = result.tally()
    rate = result.payments / result.elapsed_s if result.elapsed_s else 0.0
    rows: list[tuple[str, str]] = [
        ("payments", str(result.payments)),
        ("approved", str(tally["approved"])),
        ("declined", str(tally["declined"])),
        ("aborted", str(tally["aborted"])),
        ("rejected", str(tally["rejected"])),
        ("retries", str(result.counts["resends"])),
        ("lookups", str(result.counts["lookups"])),
        ("aborts sent", str(result.counts["aborts"])),
        ("in-doubt at end", str(report.journal_open)),
        ("duplicates", str(report.duplicates)),
        ("lost", str(report.lost)),
        ("payments/s", f"{rate:.1f}"),
        ("extra round trips/payment", f"{result.extra_round_trips:.3f}"),
        ("faults injected", str(_injected(result.faults))),
    ]
    if config.kill_clients or config.reboot_terminals:
        rows += [
            ("clients killed", str(result.killed)),
            ("settled by recover() after kill", str(result.recovered)),
        ]
    if config.outage_s:
        rows += [
            ("sold offline", str(result.counts["offline_sales"])),
            ("refused offline (limits)", str(result.counts["offline_refused"])),
            ("connections refused (outage)", str(result.faults["outage_refused"])),
            ("stored at end", str(result.stored_left)),
        ]
    if config.reboot_terminals:
        rows += [
            ("sales", str(report.sales)),
            ("sales re-run by the cashier", str(result.reruns)),
            ("customers charged twice", str(report.failures.get("one_charge_per_sale", 0))),
        ]
    rows += [(f"invariant {name}", "FAIL" if n else "ok") for name, n in report.failures.items()]
    table = Table()
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, value in rows:
        table.add_row(name, value)
    return table


def _injected(faults: Counter[str]) -> int:
    ignore = {"requests", "passed", "connections", "tunnels", "upstream_errors"}
    return sum(count for name, count in faults.items() if name not in ignore)
