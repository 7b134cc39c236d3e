"""The chaos harness's checks and its report (a rich table on the console, Markdown for
``docs/reliability.md``)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import func, select

if TYPE_CHECKING:
    from api.invariants import InvariantReport
    from loadtest.chaos import Fault

DRAIN_TIMEOUT_S = 180.0
_FAULT_NAMES = {
    "worker_kill": "API worker SIGKILLed",
    "terminal_kill": "terminal SIGKILLed, recovered",
    "postgres_restart": "PostgreSQL crash + restart",
    "redis_restart": "Redis SIGKILL + restart",
    "loss_burst": "network loss burst",
}
_RECOVERED_BY = {
    "worker_kill": "new worker up, then a probe create answered",
    "terminal_kill": "rebooted terminal finished recover()",
    "postgres_restart": "PostgreSQL up, then a probe create answered",
    "redis_restart": "Redis up, then a probe create answered",
    "loss_burst": "burst over, then a fleet payment settled",
}


@dataclass(frozen=True)
class Drained:
    processing_left: int
    outbox_unsent: int
    seconds: float


async def _pending(database_url: str, merchants: Sequence[str]) -> tuple[int, int]:
    from api.config import Settings
    from api.db import create_engine
    from api.models import IdempotencyKey, OutboxEvent

    engine = create_engine(Settings(database_url=database_url))
    try:
        async with engine.connect() as conn:
            processing = await conn.execute(
                select(func.count()).where(
                    IdempotencyKey.merchant_id.in_(merchants),
                    IdempotencyKey.state == "processing",
                )
            )
            unsent = await conn.execute(
                select(func.count()).where(
                    OutboxEvent.merchant_id.in_(merchants), OutboxEvent.sent_at.is_(None)
                )
            )
            return int(processing.scalar_one()), int(unsent.scalar_one())
    finally:
        await engine.dispose()


async def drain(database_url: str, merchants: Sequence[str]) -> Drained:
    """Wait (bounded) for the completer to finish every key and the relay every event."""
    started = time.monotonic()
    while True:
        processing, unsent = await _pending(database_url, merchants)
        if (processing == 0 and unsent == 0) or time.monotonic() - started > DRAIN_TIMEOUT_S:
            return Drained(processing, unsent, time.monotonic() - started)
        await asyncio.sleep(1.0)


@dataclass(frozen=True)
class Checks:
    fleet: InvariantReport
    probe: InvariantReport
    requests_logged: int
    status_5xx: dict[int, int]


async def check(
    database_url: str,
    *,
    merchants: list[str],
    probe: str,
    reported: dict[str, str],
    journals: Sequence[Path],
) -> Checks:
    from api.config import Settings
    from api.db import create_engine
    from api.invariants import check_invariants
    from api.models import RequestEvent

    engine = create_engine(Settings(database_url=database_url))
    try:
        fleet = await check_invariants(
            engine, merchant_ids=merchants, reported=reported, journals=journals
        )
        probed = await check_invariants(engine, merchant_ids=[probe])
        everyone = RequestEvent.merchant_id.in_([*merchants, probe])
        async with engine.connect() as conn:
            logged = int((await conn.execute(select(func.count()).where(everyone))).scalar_one())
            rows = await conn.execute(
                select(RequestEvent.http_status, func.count())
                .where(everyone, RequestEvent.http_status >= 500)
                .group_by(RequestEvent.http_status)
            )
            fives = {int(status): int(count) for status, count in rows.all()}
    finally:
        await engine.dispose()
    return Checks(fleet=fleet, probe=probed, requests_logged=logged, status_5xx=fives)


@dataclass
class Result:
    seed: int
    duration_s: float
    fleet_s: float
    terminals: int
    workers: int
    faults: list[Fault]
    skewed: str
    skew_s: float
    kills: Counter[str]
    outcomes: Counter[str]
    client_counts: Counter[str]
    proxy: dict[str, int]
    probe: tuple[int, int]  # (creates sent, failed)
    probe_outcome: dict[str, int]
    drained: Drained
    checks: Checks
    errors: list[str]
    command: str
    started: float  # monotonic start of the fleet
    when: str = field(default_factory=lambda: datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"))

    def rows(self) -> list[tuple[str, int]]:
        """(check, violations): every one must be 0."""
        fleet, probe = self.checks.fleet, self.checks.probe
        rows = [(f"fleet: {name}", n) for name, n in fleet.failures.items()]
        rows += [(f"probe merchant: {name}", n) for name, n in probe.failures.items()]
        rows += [
            ("duplicates (keys charged twice)", fleet.duplicates + probe.duplicates),
            ("lost payments", fleet.lost),
            ("journal entries not definitive", fleet.journal_open),
            ("keys stuck processing", self.drained.processing_left),
            ("outbox events never relayed", self.drained.outbox_unsent),
            ("500 answered by the server", self._unexpected_5xx()),
            ("probe keys left unsettled", self.probe_outcome.get("unsettled", 0)),
            ("faults not injected or not recovered", self._unrecovered()),
            ("harness errors (exits, timeouts)", len(self.errors)),
        ]
        return rows

    def _unexpected_5xx(self) -> int:
        return sum(n for status, n in self.checks.status_5xx.items() if status != 503)

    def _unrecovered(self) -> int:
        missing = [kind for kind in _FAULT_NAMES if not self.kills.get(kind)]
        return len(missing) + sum(1 for f in self.faults if f.recovered is None)

    @property
    def ok(self) -> bool:
        return all(n == 0 for _, n in self.rows())

    def fault_rows(self) -> list[tuple[str, ...]]:
        rows: list[tuple[str, ...]] = []
        for i, fault in enumerate(self.faults, 1):
            at = f"{fault.injected - self.started:.1f}" if fault.injected else "—"
            recover = f"{fault.recover_s:.2f}" if fault.recover_s is not None else "not recovered"
            rows.append(
                (
                    str(i),
                    at,
                    _FAULT_NAMES[fault.kind],
                    fault.detail,
                    recover,
                    str(fault.probe_failures),
                )
            )
        return rows

    def total_rows(self) -> list[tuple[str, str]]:
        counts = self.client_counts
        proxy_faults = sum(
            n
            for k, n in self.proxy.items()
            if k not in ("connections", "requests", "passed", "tunnels", "upstream_errors")
        )
        client_5xx = {k: v for k, v in counts.items() if k.startswith("http_5")}
        return [
            ("payments the terminals settled", str(sum(self.outcomes.values()))),
            ("… by outcome", ", ".join(f"{k} {v}" for k, v in sorted(self.outcomes.items()))),
            ("transactions stored (fleet)", str(self.checks.fleet.transactions)),
            ("requests through the chaos proxy", str(self.proxy.get("requests", 0))),
            ("network faults injected by the proxy", str(proxy_faults)),
            ("requests served (request events logged)", str(self.checks.requests_logged)),
            (
                "SDK round trips: creates / lookups / aborts (killed processes not counted)",
                f"{counts['creates']} / {counts['lookups']} / {counts['aborts']}",
            ),  # fmt: skip
            ("5xx seen by terminals", _fmt_counts(client_5xx) or "0"),
            ("5xx answered by the server (logged)", _fmt_counts(self.checks.status_5xx) or "0"),
            ("probe creates (failed)", f"{self.probe[0]} ({self.probe[1]})"),
            ("completer + relay drain after the run", f"{self.drained.seconds:.1f} s"),
        ]


def _fmt_counts(counts: dict[str, int] | dict[int, int]) -> str:
    return ", ".join(f"{str(k).removeprefix('http_')}: {v}" for k, v in sorted(counts.items()))


def show(result: Result) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    faults = Table(title="faults injected")
    for column in ("#", "at s", "fault", "what", "time to recover s", "probe failures"):
        faults.add_column(column)
    for row in result.fault_rows():
        faults.add_row(*row)
    console.print(faults)
    totals = Table(title="traffic")
    totals.add_column("measure")
    totals.add_column("value", justify="right")
    for name, value in result.total_rows():
        totals.add_row(name, value)
    console.print(totals)
    checks = Table(title="invariants")
    checks.add_column("check")
    checks.add_column("violations", justify="right")
    checks.add_column("")
    for name, count in result.rows():
        checks.add_row(name, str(count), "ok" if count == 0 else "[red]FAIL")
    console.print(checks)
    for violation in [*result.checks.fleet.violations, *result.checks.probe.violations][:20]:
        console.print(f"  {violation.invariant} {violation.key}: {violation.detail}")
    for error in result.errors:
        console.print(f"  [red]{error}")


def markdown(result: Result) -> str:
    lines = [
        "# Reliability: the chaos run",
        "",
        "Written by `make chaos` (`loadtest/chaos.py`; how it works: its docstring and",
        'docs/operations.md, "Chaos runs"). Figures are from one run on the shared 2-core',
        "development machine while other jobs ran on it; times to recover depend on its load.",
        "",
        f"- Command: `{result.command}` (seed {result.seed}), run {result.when}",
        f"- Fleet: {result.terminals} terminal processes (SDK + journal) over three merchants",
        f"  through the chaos proxy (3.5 % steady loss), {result.fleet_s:.0f} s of selling;",
        f"  `{result.skewed}`'s clock runs {result.skew_s:+.0f} s off for the whole run.",
        f"- Server: `idempay serve --workers {result.workers}`, `idempay completer`,",
        "  `idempay relay`, on a private PostgreSQL cluster and a private Redis.",
        f"- Verdict: **{'every invariant held' if result.ok else 'FAILED'}**.",
        "",
        "## Faults injected",
        "",
        "| # | at (s) | fault | what | time to recover (s) | probe failures |",
        "|---|---|---|---|---|---|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in result.fault_rows()]
    lines += [
        f"| – | whole run | clock skew | `{result.skewed}` clock {result.skew_s:+.0f} s | – | – |",
        "",
        "Time to recover runs from the injection until: "
        + "; ".join(f"{_FAULT_NAMES[k]} — {v}" for k, v in _RECOVERED_BY.items())
        + ". The probe sends a create straight to the API every 0.25 s.",
        "",
        "## Traffic",
        "",
        "| measure | value |",
        "|---|---|",
    ]
    lines += [f"| {name} | {value} |" for name, value in result.total_rows()]
    lines += [
        "",
        "503 answers are `service_unavailable` while PostgreSQL was down (SPEC §2: nothing",
        "was processed, the SDK retries with the same key); a 500 would be a failure.",
        "",
        "## Invariants",
        "",
        "| check | violations |",
        "|---|---|",
    ]
    lines += [f"| {name} | {count} |" for name, count in result.rows()]
    lines += [
        "",
        "## Ledger per merchant",
        "",
        "| merchant | currency | ledger (signed minor units) | approved purchases − reversals |",
        "|---|---|---|---|",
    ]
    for balance in [*result.checks.fleet.ledger, *result.checks.probe.ledger]:
        lines.append(
            f"| {balance.merchant_id} | {balance.currency} | {balance.ledger} | "
            f"{balance.expected} |"
        )
    lines += ["", *FINDINGS]
    return "\n".join(lines) + "\n"


FINDINGS = [
    "## What the chaos runs found (fixed, each with a regression test)",
    "",
    "- A terminal whose clock ran 120 s behind had every payment refused as `expired`: the",
    "  SDK set `expires_at` on the device clock. It now sets it on the server's clock,",
    "  estimated from the `Date` header (`tests/client_sdk/test_integration_clock_skew.py`).",
    "- After a PostgreSQL restart the relay kept publishing without its leadership lock (the",
    "  session holding it had died), so a standby relay could lead at the same time. It now",
    "  checks its lock session before each batch and leads again",
    "  (`tests/api/redis/test_relay_leadership.py`).",
    "- While Redis was down every request paid a Redis attempt for the rate limit, logged a",
    "  warning, and went unlimited. Limits now fall back to process memory behind a one-second",
    "  circuit (`tests/api/redis/test_outbox_and_limits.py`).",
]
