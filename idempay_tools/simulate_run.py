"""``idempay simulate`` and ``idempay demo``'s fleet step: start the simulated acquirer host
as a process of its own (``AcquirerProcess``, optionally with faults) and a server pointed at
it by ``IDEMPAY_ACQUIRER_URL`` (unless a URL is given), mint a merchant key, run the fleet
(``idempay_tools.simulate``), check contract §8 from both sides — the database and journals,
and the acquirer's own store once the reversal-advice queue has drained
(``idempay_tools.invariants``) — and render the run as a rich table; through the chaos
proxy, also the audit's link loss against the proxy's own tally
(``idempay_tools.simulate_links``). On the host it started, ``idempay simulate`` also
reconciles the run's settlement (issue 32, ``idempay_tools._chaos_settlement``): the run's
days exported to ``WORKDIR/lake``, the acquirer's clearing file of each day written from
its store and landed there, the DuckDB reference's reconciliation printed in one line and
held as two more invariants — ``settlement_exceptions`` (none, each named) and
``settlement_matched`` (its matches are the merchant's approved transactions one to one)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import replace
from datetime import UTC, date, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from idempay_tools.serve_process import ServerProcess
from idempay_tools.simulate import FleetConfig, FleetResult, run_fleet
from idempay_tools.simulate_links import audit_run, check_link_loss, days_between

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from api.acquirer.host.process import AcquirerProcess
    from idempay_tools.invariants import InvariantReport

__all__ = [
    "default_workdir",
    "describe",
    "parse_acquirer_faults",
    "render",
    "run_simulation",
    "start_acquirer",
    "start_server",
]

LATE_MARGIN_S = 3.0  # a late answer without late_seconds: this long past the link's timeout


def parse_acquirer_faults(text: str) -> dict[str, Any]:
    """``drop_answer=0.02,late_answer=0.02`` → the acquirer host's fault settings
    (``api/acquirer/host/faults.py``), checked; ``late_answer`` without ``late_seconds``
    answers ``LATE_MARGIN_S`` past ``IDEMPAY_ACQUIRER_TIMEOUT`` (later than the link waits).
    Raises ``ValueError``."""
    from api.acquirer.host.faults import Faults
    from api.config import Settings

    changes: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not name or not value:
            raise ValueError(f"expected NAME=VALUE, got {item!r}")
        if name == "down":
            if value.lower() not in ("true", "false"):
                raise ValueError("down must be true or false")
            changes[name] = value.lower() == "true"
        elif name == "drop_when":
            changes[name] = value
        else:
            try:
                changes[name] = float(value)
            except ValueError:
                raise ValueError(f"{name} must be a number, got {value!r}") from None
    if changes.get("late_answer") and "late_seconds" not in changes:
        changes["late_seconds"] = Settings().acquirer_timeout + LATE_MARGIN_S
    Faults().changed(changes)  # FaultError (a ValueError) for a name or value it refuses
    return changes


@contextlib.contextmanager
def start_acquirer(
    folder: Path, *, faults: Mapping[str, Any] | None = None, seed: int = 1
) -> Iterator[AcquirerProcess]:
    """The simulated acquirer host as a process of its own (store and log in ``folder``),
    with ``faults`` switched on once it answers a sign-on; stopped (SIGTERM) at the end."""
    from api.acquirer.host.process import AcquirerProcess

    host = AcquirerProcess(
        store=folder / "acquirer.sqlite3",
        log_path=folder / "acquirer.log",
        args=("--seed", str(seed)),
    )
    host.start()
    try:
        if faults:
            host.control(**faults)
        yield host
    finally:
        host.stop()


@contextlib.contextmanager
def start_server(
    log_path: Path, *, timeout: float = 60.0, acquirer_url: str | None = None
) -> Iterator[str]:
    """``python -m api serve`` on a free loopback port (configured database), connected to
    ``acquirer_url`` (else it starts its own child host); its URL."""
    env = {  # a fleet at full speed, not terminals' real pace (unless the caller set them)
        name: os.environ.get(name, "100000/second")
        for name in ("IDEMPAY_RATE_LIMIT", "IDEMPAY_RATE_LIMIT_TERMINAL")
    }
    if acquirer_url is not None:
        env["IDEMPAY_ACQUIRER_URL"] = acquirer_url
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


async def _check(
    api_key: str, result: FleetResult, acquirer_store: Path | None = None
) -> InvariantReport:
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
            engine,
            merchant_ids=[merchant],
            reported=result.outcomes,
            journals=result.journals,
            acquirer_store=acquirer_store,
        )
    finally:
        await engine.dispose()


def run_simulation(
    config: FleetConfig,
    *,
    start: bool,
    console: Console,
    audit_links: bool = False,
    acquirer_faults: Mapping[str, Any] | None = None,
    acquirer_store: Path | None = None,
    reconcile: bool | None = None,
) -> tuple[FleetResult, InvariantReport]:
    """Start the acquirer host and a server on it (when ``start``) and a merchant key, run
    the fleet, check §8 — the acquirer's side on the store of the host started here (with
    ``acquirer_faults`` on for the whole run), or on ``acquirer_store`` for a running server.

    ``audit_links`` (through the proxy, on a server started here): once the server has
    stopped (every request event flushed), export the run's days to ``WORKDIR/lake``, run
    the Spark audit into ``WORKDIR/audit`` and compare its link loss with the proxy's
    tally (``result.link_loss``); not with ``outage_s``, whose refused connections never
    reach the proxy.

    ``reconcile`` (default: ``audit_links``; on a host started here): once the server has
    stopped, the settlement reconciliation of the run (the module docstring), its line
    printed and its two invariants added to the report."""
    from rich.console import Console

    if not start:
        console.print(f"server {config.base_url} · journals in {config.workdir}")
        if acquirer_store is None:
            console.print("acquirer checks not run: no --acquirer-store for a running server")
        result = run_fleet(config, console=Console(stderr=True))
        return result, asyncio.run(_check(config.api_key, result, acquirer_store))
    config.workdir.mkdir(parents=True, exist_ok=True)
    first = datetime.now(UTC).date()
    folder = config.workdir / "acquirer"
    with (
        start_acquirer(folder, faults=acquirer_faults, seed=config.seed) as host,
        start_server(config.workdir / "server.log", acquirer_url=host.url) as url,
    ):
        api_key = asyncio.run(_new_api_key(f"simulate-{uuid.uuid4().hex[:12]}"))
        faults = ", ".join(f"{k}={v}" for k, v in (acquirer_faults or {}).items()) or "none"
        console.print(f"server {url} · journals in {config.workdir}")
        console.print(
            f"acquirer host {host.url} (pid {host.pid}, store {host.store}) · faults {faults}"
        )
        config = replace(config, base_url=url, api_key=api_key)
        result = run_fleet(config, console=Console(stderr=True))
        report = asyncio.run(_check(api_key, result, host.store))  # the server still runs
    days = days_between(first, datetime.now(UTC).date())
    lake, exported = config.workdir / "lake", False
    if audit_links and result.link is not None and config.outage_s:
        # The outage refuses connections in the terminals' own transport, before the proxy:
        # attempts lost there are link loss the audit sees and the proxy never counted.
        console.print("link loss not checked against the proxy: --outage drops before it")
    elif audit_links and result.link is not None and result.merchant_id is not None:
        out = config.workdir / "audit"
        console.print(f"exporting the run and auditing it (Spark) → {out}")
        audit_run(lake, out, days)
        exported = True
        result.link_loss = check_link_loss(
            result.link, result.outcomes, audit_out=out, merchant_id=result.merchant_id
        )
    if (audit_links if reconcile is None else reconcile) and result.merchant_id is not None:
        report = _reconcile(
            report,
            store=host.store,
            lake=lake,
            folder=config.workdir / "clearing",
            days=days,
            merchant=result.merchant_id,
            exported=exported,
            console=console,
        )
    return result, report


def _export(lake: Path, days: list[date]) -> None:
    """The configured database's ``days`` into ``lake`` (as ``idempay export``)."""
    from api.config import Settings
    from api.db import create_engine
    from api.events.export import export_day

    async def run() -> None:
        engine = create_engine(Settings())
        try:
            for day in days:
                await export_day(engine, lake, day)
        finally:
            await engine.dispose()

    asyncio.run(run())


def _reconcile(
    report: InvariantReport,
    *,
    store: Path,
    lake: Path,
    folder: Path,
    days: list[date],
    merchant: str,
    exported: bool,
    console: Console,
) -> InvariantReport:
    """The run's settlement reconciliation (the module docstring), printed; ``report``
    with its invariants (``settlement_exceptions``, ``settlement_matched``, or
    ``settlement_reconciled`` when it could not run) and each violation named."""
    from idempay_tools._chaos_settlement import check_settlement, describe
    from idempay_tools.invariants import Violation

    try:
        if not exported:
            _export(lake, days)
        settlement = asyncio.run(
            check_settlement(
                database_url=None,
                store=store,
                lake=lake,
                folder=folder,
                run_days=days,
                merchants=[merchant],
            )
        )
    except Exception as exc:  # reported as a failed invariant, not a traceback
        console.print(f"[red]settlement reconciliation failed: {type(exc).__name__}: {exc}[/]")
        failed = Violation("settlement_reconciled", None, f"{type(exc).__name__}: {exc}")
        return replace(
            report,
            failures={**report.failures, "settlement_reconciled": 1},
            violations=(*report.violations, failed),
        )
    style = "green" if settlement.ok else "red"
    console.print(f"[{style}]{settlement.line()}[/]", highlight=False, soft_wrap=True)
    violations = [
        Violation("settlement_exceptions", str(row["rrn"]), describe(row))
        for row in settlement.exceptions
    ]
    violations += [Violation("settlement_matched", None, what) for what in settlement.unmatched]
    return replace(
        report,
        failures={
            **report.failures,
            "settlement_exceptions": len(settlement.exceptions),
            "settlement_matched": len(settlement.unmatched),
        },
        violations=(*report.violations, *violations),
    )


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
    if report.acquirer is not None:
        rows += _acquirer_rows(report)
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


def _acquirer_rows(report: InvariantReport) -> list[tuple[str, str]]:
    check = report.acquirer
    assert check is not None
    messages = check.messages
    dropped = sum(n for name, n in messages.items() if not name.endswith(" answered"))
    return [
        ("acquirer: 0200s received", str(check.requests)),
        ("acquirer: answers withheld (dropped, cut)", str(dropped)),
        ("acquirer: net approvals", str(check.net_approvals)),
        ("approved transactions", str(check.approved)),
        ("declined acquirer_timeout (in doubt)", str(check.timeouts)),
        ("acquirer: approvals reversed", str(check.reversed)),
        ("reversal advices queued", str(check.advices)),
        ("advice queue at the check", str(check.advice_depth)),
    ]
