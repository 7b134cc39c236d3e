"""What one failover mode saw, on the terminal and as Markdown (``--report``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from idempay_tools._chaos_report import Drained
from idempay_tools._failover_checks import FailoverChecks
from idempay_tools.serve_process import say


@dataclass
class Event:
    """A failover or a switchover: monotonic times from the kill (or the request)."""

    kind: str
    detail: str
    at: float
    old: str = ""
    new: str = ""
    promoted: float | None = None  # Patroni names the new leader
    recovered: float | None = None  # a probe create answered 201/202 again
    rejoined: float | None = None  # the old primary streams as a standby again
    rewound: bool = False  # pg_rewind ran on the old primary

    def since(self, moment: float | None) -> str:
        return "–" if moment is None else f"{moment - self.at:.1f}"


@dataclass
class ModeResult:
    mode: str
    fleet_s: float
    terminals: int
    lag_s: float
    events: list[Event]
    outcomes: dict[str, int]
    probe: tuple[int, int]  # (creates sent, failed)
    probe_outcome: dict[str, int]
    drained: Drained
    checks: FailoverChecks
    lost_lookups: dict[int, int]  # status of GET for each lost payment → count
    errors: list[str] = field(default_factory=list)
    members: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (
            self.checks.ok
            and self.drained.processing_left == 0
            and not self.errors
            and all(e.recovered is not None and e.rejoined is not None for e in self.events)
        )


def _rows(result: ModeResult) -> list[tuple[str, str]]:
    fleet, checks = result.checks.fleet, result.checks
    return [
        ("payments the terminals settled", f"{sum(result.outcomes.values())} {result.outcomes}"),
        ("acknowledged payments lost (new primary lacks them)", str(fleet.lost)),
        ("duplicates (a key charged twice)", str(fleet.duplicates)),
        ("keys left processing after the drain", str(result.drained.processing_left)),
        ("journal entries not definitive", str(fleet.journal_open)),
        ("ledger balanced (every merchant)", "yes" if all(b.ok for b in fleet.ledger) else "NO"),
        ("invariants failed", ", ".join(fleet.failed()) or "none"),
        ("probe merchant invariants", ", ".join(checks.probe.failed()) or "ok"),
        ("lookups of the lost payments (status → count)", str(result.lost_lookups or "–")),
        ("outbox: events / unsent / seq gaps",
         f"{checks.outbox.events} / {checks.outbox.unsent} / {checks.outbox.seq_gaps}"),
        ("5xx the server logged", str(checks.status_5xx or "none")),
        ("probe creates (sent / failed)", f"{result.probe[0]} / {result.probe[1]}"),
        ("checks read from", checks.served_by),
    ]  # fmt: skip


def show(result: ModeResult) -> None:
    say(f"failover[{result.mode}]: {'ok' if result.ok else 'FAILED'}")
    for event in result.events:
        say(f"  {event.kind}: {event.old} → {event.new};"
            f" promoted +{event.since(event.promoted)} s,"
            f" recovered +{event.since(event.recovered)} s, old primary back"
            f" +{event.since(event.rejoined)} s"
            f"{' (pg_rewind)' if event.rewound else ''}")  # fmt: skip
    for name, value in _rows(result):
        say(f"  {name}: {value}")
    for error in result.errors:
        say(f"  error: {error}")


def markdown(results: list[ModeResult], command: str) -> str:
    lines = [f"- Command: `{command}`", ""]
    for result in results:
        replication = "synchronous" if result.mode == "sync" else "asynchronous"
        lines += [
            f"### {replication.capitalize()} replication (`{result.mode}`): "
            f"{'passed' if result.ok else 'FAILED' if result.mode == 'sync' else 'measured'}",
            "",
            f"{result.terminals} terminals through the chaos proxy, {result.fleet_s:.0f} s; "
            f"replication stalled {result.lag_s:g} s before the kill.",
            "",
            "| event | what | promoted (s) | probe create answered (s) | old primary streaming "
            "again (s) | pg_rewind |",
            "|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {e.kind} {e.old} → {e.new} | {e.detail} | {e.since(e.promoted)} | "
            f"{e.since(e.recovered)} | {e.since(e.rejoined)} | {'yes' if e.rewound else 'no'} |"
            for e in result.events
        ]
        lines += ["", "| measure | value |", "|---|---|"]
        lines += [f"| {name} | {value} |" for name, value in _rows(result)]
        lines += [f"| error | {error} |" for error in result.errors]
        lines.append("")
    return "\n".join(lines)
