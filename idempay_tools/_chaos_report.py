"""The chaos harness's checks and its report (a rich table on the console, Markdown for
``docs/reliability.md``)."""

from __future__ import annotations

import asyncio
import functools
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import func, select

from idempay_tools._chaos_acquirer import NAMES as ACQUIRER_NAMES
from idempay_tools._chaos_acquirer import RECOVERED_BY as ACQUIRER_RECOVERED_BY
from idempay_tools._chaos_settlement import describe as describe_exception

if TYPE_CHECKING:
    from idempay_tools._chaos_lake import LakeCheck
    from idempay_tools._chaos_outage import Held, OfflineCheck
    from idempay_tools._chaos_phases import NoisyNeighbour
    from idempay_tools._chaos_settlement import Settlement
    from idempay_tools.chaos import Fault
    from idempay_tools.invariants import InvariantReport

DRAIN_TIMEOUT_S = 180.0
_FAULT_NAMES = {
    "worker_kill": "API worker SIGKILLed",
    "terminal_kill": "terminal SIGKILLed, recovered",
    "postgres_restart": "PostgreSQL crash + restart",
    "redis_restart": "Redis SIGKILL + restart",
    "loss_burst": "network loss burst",
    "journal_full": "terminal journal disk full",
    "db_restore": "database restored from a dump, Redis kept",
    "rolling_restart": "API workers SIGTERMed in turn (rolling restart)",
    "noisy_neighbour": "noisy neighbour: issuer-down flood",
    "link_outage": "link outage: terminals sell offline, two SIGKILLed holding stored payments",
    "backend_kill": "PostgreSQL backend kill -9 during a create",
    **ACQUIRER_NAMES,
}
_RECOVERED_BY = {
    "worker_kill": "new worker up, then a probe create answered",
    "terminal_kill": "rebooted terminal finished recover()",
    "postgres_restart": "PostgreSQL up, then a probe create answered",
    "redis_restart": "Redis up, then a probe create answered",
    "loss_burst": "burst over, then a fleet payment settled",
    "journal_full": "limit lifted, then that terminal settled a payment",
    "db_restore": "API up on the restored database, then a probe create answered",
    "rolling_restart": "every worker replaced, then a probe create answered",
    "noisy_neighbour": "every victim payment final",
    "link_outage": "link back, then every terminal of the outage reported nothing stored",
    "backend_kill": "the backend killed, then a probe create answered",
    **ACQUIRER_RECOVERED_BY,
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


async def drain(
    database_url: str, merchants: Sequence[str], *, within: float = DRAIN_TIMEOUT_S
) -> Drained:
    """Wait (at most ``within`` seconds) for the completer to finish every key and the relay
    every event; what was left then."""
    started = time.monotonic()
    while True:
        processing, unsent = await _pending(database_url, merchants)
        waited = time.monotonic() - started
        if (processing == 0 and unsent == 0) or waited + 1.0 > within:
            return Drained(processing, unsent, waited)
        await asyncio.sleep(1.0)


@dataclass(frozen=True)
class AdviceDrain:
    depth: int  # reversal advices not acknowledged when the wait ended (must be 0)
    seconds: float


async def drain_advices(
    database_url: str, merchants: Sequence[str], *, within: float
) -> AdviceDrain:
    """Wait (at most ``within`` seconds) for the API's advice worker to have every
    reversal advice of ``merchants`` acknowledged by the acquirer (a 0430)."""
    from api.config import Settings
    from api.db import create_engine
    from idempay_tools.invariants import wait_advice_drained

    engine = create_engine(Settings(database_url=database_url))
    try:
        depth, waited = await wait_advice_drained(engine, merchants, within=within, poll=1.0)
    finally:
        await engine.dispose()
    return AdviceDrain(depth, waited)


def wall_windows(windows: Sequence[tuple[float, float]]) -> list[tuple[datetime, datetime]]:
    """Unix-time windows as UTC datetimes."""
    return [(datetime.fromtimestamp(a, UTC), datetime.fromtimestamp(b, UTC)) for a, b in windows]


@dataclass(frozen=True)
class Checks:
    fleet: InvariantReport
    probe: InvariantReport
    noisy: InvariantReport
    requests_logged: int
    status_5xx: dict[int, int]
    server_knows: frozenset[str]  # of the keys asked about: those the server holds
    stale_after_restore: frozenset[str]  # answered 200 after a restore, no transaction


async def check(
    database_url: str,
    *,
    merchants: list[str],
    probe: str,
    noisy: str,
    reported: dict[str, str],
    restored_away: set[str],
    journals: Sequence[Path],
    ask: Sequence[str] = (),
    held_after_restore: Sequence[str] = (),
    acquirer_store: Path | None = None,
    acquirer_exempt: Sequence[tuple[datetime, datetime]] = (),
) -> Checks:
    from api.config import Settings
    from api.db import create_engine
    from api.models import IdempotencyKey, RequestEvent, Transaction
    from idempay_tools.invariants import check_invariants

    engine = create_engine(Settings(database_url=database_url))
    try:
        # The advice queue was drained while the API ran: here it is only read again.
        acquirer = functools.partial(
            check_invariants,
            engine,
            acquirer_store=acquirer_store,
            acquirer_exempt=acquirer_exempt,
            drain_within=5.0,
        )
        fleet = await acquirer(
            merchant_ids=merchants,
            reported=reported,
            journals=journals,
            restored_away=restored_away,
        )
        probed = await acquirer(merchant_ids=[probe])
        flooded = await acquirer(merchant_ids=[noisy])
        everyone = RequestEvent.merchant_id.in_([*merchants, probe, noisy])
        async with engine.connect() as conn:
            logged = int((await conn.execute(select(func.count()).where(everyone))).scalar_one())
            rows = await conn.execute(
                select(RequestEvent.http_status, func.count())
                .where(everyone, RequestEvent.http_status >= 500)
                .group_by(RequestEvent.http_status)
            )
            fives = {int(status): int(count) for status, count in rows.all()}
            known = await conn.execute(
                select(IdempotencyKey.key).where(
                    IdempotencyKey.merchant_id.in_(merchants), IdempotencyKey.key.in_(list(ask))
                )
            )
            server_knows = frozenset(str(key) for (key,) in known)
            held = await conn.execute(
                select(Transaction.id).where(
                    Transaction.merchant_id.in_(merchants),
                    Transaction.id.in_(list(held_after_restore)),
                )
            )
            stale = frozenset(held_after_restore) - {str(key) for (key,) in held}
    finally:
        await engine.dispose()
    return Checks(
        fleet=fleet,
        probe=probed,
        noisy=flooded,
        requests_logged=logged,
        status_5xx=fives,
        server_knows=server_knows,
        stale_after_restore=stale,
    )


@dataclass
class Result:
    seed: int
    duration_s: float
    fleet_s: float
    terminals: int
    workers: int
    faults: list[Fault]
    skewed: dict[str, float]  # terminal → clock offset (s)
    lake: LakeCheck
    offline: OfflineCheck
    outage_terminals: list[str]  # the terminals whose link went down
    held: list[Held]  # terminals SIGKILLed in the outage and what they held
    exports: dict[str, int]  # ok / failed / timed_out export runs
    noisy: NoisyNeighbour
    journal_failures: list[tuple[str, str, str]]  # (terminal, key, kind)
    refused_skewed: int  # payments refused on a terminal whose clock is off
    restored_away: int  # keys reported between a dump and its restore
    restore_lookups: dict[str, int]  # key → status of its lookup right after the restore
    kills: Counter[str]
    outcomes: Counter[str]
    client_counts: Counter[str]
    proxy: dict[str, int]
    probe: tuple[int, int]  # (creates sent, failed)
    probe_outcome: dict[str, int]
    drained: Drained
    advices: AdviceDrain
    acquirer_kills: int
    checks: Checks
    errors: list[str]
    command: str
    started: float  # monotonic start of the fleet
    phases: list[tuple[str, str, str, str]]  # (phase, at s, took s, budget s)
    budget_s: float  # the whole run's deadline
    when: str = field(default_factory=lambda: datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"))
    # The acquirer's clearing files against the lake (``_chaos_settlement``); None: it failed
    # (the harness error says why).
    settlement: Settlement | None = None

    def rows(self) -> list[tuple[str, int]]:
        """(check, violations): every one must be 0."""
        fleet, probe, noisy = self.checks.fleet, self.checks.probe, self.checks.noisy
        rows = [(f"fleet: {name}", n) for name, n in fleet.failures.items()]
        rows += [(f"probe merchant: {name}", n) for name, n in probe.failures.items()]
        rows += [(f"noisy merchant: {name}", n) for name, n in noisy.failures.items()]
        rows += [
            (
                "duplicates (keys charged twice)",
                fleet.duplicates + probe.duplicates + noisy.duplicates,
            ),
            ("payments refused on a clock-skewed terminal", self.refused_skewed),
            ("raw storage errors after the request reached the server", self._raw_after_send()),
            (
                "lookups after a restore answered from before it (no such transaction)",
                len(self.checks.stale_after_restore),
            ),
            (
                "victim payments not final within the deadline (noisy neighbour)",
                len(self.noisy.late_or_lost()) if self.kills.get("noisy_neighbour") else 0,
            ),
            *self.lake.rows(),
            *self.offline.rows(),
            ("lost payments", fleet.lost),
            ("journal entries not definitive", fleet.journal_open),
            ("keys stuck processing", self.drained.processing_left),
            ("outbox events never relayed", self.drained.outbox_unsent),
            ("reversal advices not acknowledged after the drain", self.advices.depth),
            *self._settlement_rows(),
            ("500 answered by the server", self._unexpected_5xx()),
            ("probe keys left unsettled", self.probe_outcome.get("unsettled", 0)),
            ("faults not injected or not recovered", self._unrecovered()),
            ("harness errors (exits, timeouts)", len(self.errors)),
        ]
        return rows

    def _settlement_rows(self) -> list[tuple[str, int]]:
        if self.settlement is None:
            return [("settlement reconciliation not computed (harness error)", 1)]
        return self.settlement.rows()

    def _raw_after_send(self) -> int:
        return sum(
            1
            for _, key, kind in self.journal_failures
            if kind == "storage_error" and key in self.checks.server_knows
        )

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
        for i, fault in enumerate(sorted(self.faults, key=lambda f: f.at_s), 1):
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
            (
                "lake exports during the run + final (failed, timed out)",
                f"{sum(self.exports.values())} ({self.exports.get('failed', 0)}, "
                f"{self.exports.get('timed_out', 0)})",
            ),
            (
                "request events: database / lake",
                f"{self.lake.db_events} / {self.lake.lake_events}",
            ),
            (
                "probe creates answered / exempt from the event check",
                f"{self.lake.probe_answered} / {self.lake.probe_exempt}",
            ),
            (
                "… exempt as answered 503 while storage was down / of them not logged",
                f"{self.lake.probe_down_503} / {self.lake.probe_down_503_unlogged}",
            ),
            ("journal failures on terminals (kind: count)", self._journal_failures()),
            ("payments reported between a dump and its restore", str(self.restored_away)),
            (
                "… looked up right after the restore (status: count)",
                _fmt_counts(dict(Counter(self.restore_lookups.values()))) or "—",
            ),
            ("noisy neighbour: victim payments (status, seconds)", self._victims()),
            ("completer + relay drain after the run", f"{self.drained.seconds:.1f} s"),
            ("reversal-advice queue drain after the run", f"{self.advices.seconds:.1f} s"),
        ]

    def acquirer_rows(self) -> list[tuple[str, str]]:
        """The acquirer's side: its store against the database, per merchant group."""
        checked = (
            ("fleet", self.checks.fleet),
            ("probe", self.checks.probe),
            ("noisy", self.checks.noisy),
        )
        found = [(name, r.acquirer) for name, r in checked if r.acquirer is not None]
        if not found:
            return [("acquirer checks", "not run")]
        rows: list[tuple[str, str]] = []
        for name, a in found:
            assert a is not None
            rows += [
                (f"{name}: 0200s received / RRNs", f"{a.requests} / {a.rrns}"),
                (
                    f"{name}: acquirer net approvals / approved transactions",
                    f"{a.net_approvals} / {a.approved}",
                ),
                (
                    f"{name}: in doubt (declined acquirer_timeout) / advices / reversed",
                    f"{a.timeouts} / {a.advices} / {a.reversed}",
                ),
                (f"{name}: RRNs exempt (first received in a restore's window)", str(a.exempt)),
            ]
        messages = found[0][1].messages if found[0][1] is not None else {}
        withheld = {k: v for k, v in messages.items() if not k.endswith(" answered")}
        rows += [
            ("acquirer messages not answered (MTI fate: count)", _fmt_counts(withheld) or "0"),
            ("acquirer host kill -9 and restarts", str(self.acquirer_kills)),
            ("reversal advices left when the drain ended", str(self.advices.depth)),
        ]
        if self.settlement is not None:
            rows += self.settlement.figures()
        return rows

    def offline_rows(self) -> list[tuple[str, str]]:
        rows = [("terminals whose link went down", ", ".join(self.outage_terminals) or "—")]
        rows += [
            (f"SIGKILLed {h.when}", f"{h.terminal}, holding {len(h.keys)} stored")
            for h in self.held
        ]
        return rows + self.offline.figures()

    def _journal_failures(self) -> str:
        kinds = Counter(kind for _, _, kind in self.journal_failures)
        return _fmt_counts(dict(kinds)) or "0"

    def _victims(self) -> str:
        return (
            ", ".join(
                f"{v.status} {v.seconds:.1f}" if v.seconds is not None else v.status
                for v in self.noisy.results
            )
            or "—"
        )


def _policy() -> str:
    from idempay_tools._chaos_outage import OUTAGE_POLICY as policy

    return (
        f"floor limit {policy.floor_limit}, at most {policy.max_stored_count} payments and "
        f"{policy.max_stored_amount} stored, max age {policy.max_age_s:g} s (minor units)"
    )


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
    offline = Table(title="link outage: offline store and forward")
    offline.add_column("measure")
    offline.add_column("value", justify="right")
    for name, value in result.offline_rows():
        offline.add_row(name, value)
    console.print(offline)
    acquirer = Table(title="the acquirer: its store against the database")
    acquirer.add_column("measure")
    acquirer.add_column("value", justify="right")
    for name, value in result.acquirer_rows():
        acquirer.add_row(name, value)
    console.print(acquirer)
    phases = Table(title=f"phases (the run's deadline {result.budget_s:.0f} s)")
    for column in ("phase", "at s", "took s", "budget s"):
        phases.add_column(column)
    for row in result.phases:
        phases.add_row(*row)
    console.print(phases)
    checked = (result.checks.fleet, result.checks.probe, result.checks.noisy)
    for violation in [v for report in checked for v in report.violations][:20]:
        console.print(f"  {violation.invariant} {violation.key}: {violation.detail}")
    for example in (*result.lake.examples, *result.offline.examples):
        console.print(f"  {example}")
    if result.settlement is not None:
        console.print(result.settlement.line(), markup=False, highlight=False, soft_wrap=True)
        for named in result.settlement.named():
            console.print(f"  {named}", markup=False, highlight=False, soft_wrap=True)
    for terminal, key, kind in result.journal_failures:
        if key:
            known = "on the server" if key in result.checks.server_knows else "not on the server"
            console.print(f"  {kind} on {terminal}: {key} ({known})")
    for key in sorted(result.checks.stale_after_restore)[:10]:
        console.print(f"  [red]answered 200 after the restore, no transaction: {key}")
    for error in result.errors:
        console.print(f"  [red]{error}")


def markdown(result: Result) -> str:
    lines = [
        "# Reliability: the chaos run",
        "",
        "Written by `make chaos` (`idempay_tools/chaos.py`; how it works: its docstring and",
        'docs/operations.md, "Chaos runs"). Figures are from one run on the shared 2-core',
        "development machine while other jobs ran on it; times to recover depend on its load.",
        "",
        f"- Command: `{result.command}` (seed {result.seed})",
        f"- Fleet: {result.terminals} terminal processes (SDK + journal) over three merchants",
        f"  through the chaos proxy (3.5 % steady loss), {result.fleet_s:.0f} s of selling;",
        "  clocks off for the whole run: "
        + ", ".join(f"`{t}` {s:+.0f} s" for t, s in result.skewed.items())
        + " (the server's tolerance for clocks ahead is 5 min).",
        "- Beside the fleet: a probe (one create straight to the API every 0.25 s), `idempay",
        "  export` of the run's days in a loop (and once more after the API stopped), and a",
        "  fourth merchant for the noisy-neighbour flood.",
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
        *(
            f"| – | whole run | clock skew | `{t}` clock {s:+.0f} s | – | – |"
            for t, s in result.skewed.items()
        ),
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
        "## Link outage: offline store and forward",
        "",
        "The outage of `idempay simulate --outage` (`idempay_tools/simulate_outage.py`), in",
        "the run's first fault slot. Every terminal sells under an offline policy —",
        f"{_policy()}.",
        "For the terminals below every connection is refused for the outage's hold, so",
        "they sell offline (within those limits), and two of them are SIGKILLed holding stored",
        "payments — one 40 % into the outage (it may reboot while the link is still down:",
        "it recovers what it can and sells offline on top of what it held), one just before",
        "the link comes back (its `recover()` at boot forwards). The invariants (`offline: …`",
        "rows under Invariants) are read from every journal and the database.",
        "",
        "| measure | value |",
        "|---|---|",
    ]
    lines += [f"| {name} | {value} |" for name, value in result.offline_rows()]
    if result.offline.examples:
        lines += ["", "Offline violations (the first 20):", ""]
        lines += [f"- `{example}`" for example in result.offline.examples]
    lines += [
        "",
        "## The acquirer across the network",
        "",
        "The simulated acquirer host runs as a process of its own for the whole run",
        "(`idempay_tools/_chaos_acquirer.py`); the API reaches it over ISO 8583/TCP",
        "(`IDEMPAY_ACQUIRER_URL`, acquirer timeout 10 s). Its episodes (in the faults table):",
        "a latency spike, dropped answers, answers later than the acquirer timeout, dropped",
        "connections, `kill -9` of the host (restarted on the same store and port) and an",
        "outage (30 s when the run has room for it). They are part of the run's one fault",
        "schedule, one at a time and never while the link outage or the noisy neighbour",
        "runs (their checks assume a reachable acquirer: stored payments forwarded, victims",
        "final within the deadline); other server faults may overlap them. After the run,",
        "while the API still runs, the reversal-advice queue must drain; then the acquirer's",
        "store is read against the",
        "database (the `acquirer_…` rows under Invariants): at most one 0200 per key; its",
        "approvals net of reversals equal the approved transactions one to one by RRN; every",
        "key declined `acquirer_timeout` has an acknowledged advice. An RRN the acquirer",
        "first received between a dump and its restore is exempt (the restore took back what",
        "covered it) and counted.",
        "",
        "Then the settlement reconciliation (`idempay_tools/_chaos_settlement.py`, contract",
        "§5): the acquirer's clearing file of each day of the run is written from its store,",
        "landed in the run's lake (`idempay lake add-clearing`) and reconciled by the DuckDB",
        "reference (`analytics/duckdb_reference.py`): after the drain there must be no",
        "exception, and the RRNs it matched must be the approved transactions of the",
        "database one to one (the `settlement` rows under Invariants; exceptions on an RRN a",
        "restore exempts are counted apart).",
        "",
        "| measure | value |",
        "|---|---|",
    ]
    lines += [f"| {name} | {value} |" for name, value in result.acquirer_rows()]
    if result.settlement is not None and result.settlement.named():
        lines += ["", "Settlement exceptions and mismatches (the first 20 of each):", ""]
        lines += [f"- `{named}`" for named in result.settlement.named()]
    if result.settlement is not None and result.settlement.exempt_exceptions:
        lines += ["", "Exceptions on RRNs a restore exempts (not counted):", ""]
        lines += [
            f"- `{describe_exception(row)}`" for row in result.settlement.exempt_exceptions[:20]
        ]
    lines += [
        "",
        "503 answers are `service_unavailable` while PostgreSQL was down (contract §2: nothing",
        "was processed, the SDK retries with the same key); a 500 would be a failure.",
        "",
        "## Invariants",
        "",
        "| check | violations |",
        "|---|---|",
    ]
    lines += [f"| {name} | {count} |" for name, count in result.rows()]
    lines += ["", *INVARIANT_NOTES]
    lines += [
        "",
        "## Ledger per merchant",
        "",
        "| merchant | currency | ledger (signed minor units) | approved purchases − reversals |",
        "|---|---|---|---|",
    ]
    checked = (result.checks.fleet, result.checks.probe, result.checks.noisy)
    for balance in [b for report in checked for b in report.ledger]:
        lines.append(
            f"| {balance.merchant_id} | {balance.currency} | {balance.ledger} | "
            f"{balance.expected} |"
        )
    lines += [
        "",
        "## Phases",
        "",
        "Wall time of each phase of the run (each has a budget derived from the",
        "duration, and a phase that overruns fails the run, named); the whole run's deadline",
        f"was {result.budget_s:.0f} s.",
        "",
        "| phase | at (s) | took (s) | budget (s) |",
        "|---|---|---|---|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in result.phases]
    lines += ["", *FINDINGS]
    return "\n".join(lines) + "\n"


INVARIANT_NOTES = [
    "What the less obvious rows mean:",
    "",
    "- *payments refused on a clock-skewed terminal*: contract §4, a terminal whose clock is off",
    "  still sells (the SDK corrects its clock by the server's); a refusal (e.g. 422",
    "  `clock_skew` for the terminal 15 min ahead) counts.",
    "- *raw storage errors after the request reached the server*: contract §4, a journal failure",
    "  after a request may have left is `PaymentInDoubt`, never a raw `sqlite3` error;",
    "  counted when the key of the failed payment is on the server.",
    "- *victim payments not final within the deadline*: contract §2, one",
    "  merchant's issuer-down flood must not delay another's payment past its end (approved,",
    "  or declined `acquirer_timeout` when the acquirer never answered it).",
    "- *request events … lake*: after the final export every request event in the",
    "  database is in the lake exactly once and no event id twice; every create the probe",
    "  got an answer to is logged exactly once, except creates answered in the 5 s before a",
    "  worker SIGKILL (its unflushed events: the one documented loss), between a dump and",
    "  its restore (the restore takes them back), and creates answered 503 while PostgreSQL",
    "  was down (a worker whose cached API key had expired refuses them before it knows the",
    "  merchant, and an event has no row without one; counted in the Traffic table).",
    "- *offline: …*: contract §4.12 and §8, over every journal and the database:",
    "  every payment sold offline (a journal entry holding an advice) ends forwarded —",
    "  exactly one transaction, with the journal's status and `offline = true` — or refused",
    "  as the contract says (422 `advice_too_old`, or a fenced key: REPORTED, no",
    "  transaction); none left stored; every key the SDK answered `offline=True` is in its",
    "  journal; every payment a killed terminal held was forwarded or refused so; no",
    "  offline key with two charges, no offline transaction no terminal stored; no stored",
    "  count or amount a terminal reported over the policy, no offline sale over the floor.",
    "- Payments reported between a dump and its restore are not required to be in the",
    "  database (the restore took them back; never twice); a payment reported *after* the",
    "  restore must be, so a stale Redis answer for a key the restored database lacks counts",
    "  as lost.",
    "",
]

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
    "",
    "## What the clock, restore, restart and noisy-neighbour faults found",
    "",
    "- Before the SDK fix (757902e), a 300 s run (seed 7) had 835 payments refused with 422",
    "  `clock_skew` on the terminal 15 min ahead and 4 raw `sqlite3` errors out of",
    "  `purchase()` for payments the server held (journal disk full after the send). After",
    "  it, the disk-full episode gives `PaymentInDoubt` (settled by `recover()`), but a",
    "  terminal 15 min ahead still has its *first* payment after each boot refused with",
    "  `clock_skew`: the SDK corrects its clock only once a `Date` header taught it the",
    "  offset (open: contract §4 says such a terminal sells).",
    "- Database restore with Redis kept: after `idempay admin new-epoch` no lookup of a",
    "  payment the restore took back was answered from the cache (every 200 had its",
    "  transaction in the restored database).",
    "- Rolling SIGTERM restarts, worker SIGKILLs and the export loop: every request event",
    "  in the database was in the lake exactly once and every answered probe create was",
    "  logged once (after the event-writer fix, 7985f2a).",
    "- Noisy neighbour (45 connections of `tok_issuer_down`, issuer deadline 30 s): the",
    "  victims' `tok_issuer_timeout` payments were approved in 6-17 s, before and after the",
    "  completer fairness change; the flood here is shorter than the one that first showed the",
    "  delay.",
]
