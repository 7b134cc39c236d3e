"""Link loss against ground truth: the chaos proxy's own tally of the creates it lost,
against the audit's ``unseen_attempts`` (contract §5) for the fleet's merchant.

The proxy tells ``LinkLedger`` the fate of every request (``ChaosProxy(on_request=…)``).
Per key it keeps the creates (``POST /v1/transactions``) it

- **lost**: dropped before forwarding (``drop_request``, ``reset_before``): they never
  reached the server — what the audit calls unseen attempts;
- **forwarded**: passed on to the server, answer delivered or not; of these, **answer
  lost** (``drop_response``, ``reset_after``) reached the server, so they are arrived
  attempts, not unseen ones, although the terminal never heard back;
- **unsure**: could not forward (an upstream error): they may or may not have arrived.

The audit counts unseen attempts only over keys that became transactions, so the proxy's
figure is its lost creates on the payments the terminals report approved or declined
(lost creates of the others are shown apart). The check, "agree within the requests the
proxy dropped after forwarding":

    proxy lost  ≤  audit unseen_attempts  ≤  proxy lost + answer lost + unsure

On a healthy run the two are equal: a create lost on the way is always followed by a later
attempt of the same key that arrives (the SDK looks the key up, hears 404 and resends), and
the server reads the gap from that attempt's ``Idempotency-Attempt``. Both link-loss rates
are shown: the audit's ``unseen ÷ (unseen + received)`` and the proxy's
``lost ÷ (lost + forwarded)``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path

__all__ = [
    "LinkLedger",
    "LinkLossCheck",
    "LinkTally",
    "audit_figures",
    "audit_run",
    "check_link_loss",
    "days_between",
    "render_link_check",
]

CREATE = "POST /v1/transactions "
LOST = frozenset({"drop_request", "reset_before"})
ANSWER_LOST = frozenset({"drop_response", "reset_after"})
UNSURE = "upstream_errors"
TRANSACTION_STATUSES = frozenset({"approved", "declined", "reversed"})


@dataclass
class LinkTally:
    """Creates through the proxy, by fate (see the module docstring)."""

    lost: int = 0
    forwarded: int = 0
    answer_lost: int = 0
    unsure: int = 0

    def add(self, other: LinkTally) -> None:
        self.lost += other.lost
        self.forwarded += other.forwarded
        self.answer_lost += other.answer_lost
        self.unsure += other.unsure

    @property
    def rate(self) -> float:
        sent = self.lost + self.forwarded
        return self.lost / sent if sent else 0.0


class LinkLedger:
    """Per idempotency key, what the proxy did with its creates; ``observe`` is the
    proxy's ``on_request`` (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._keys: dict[str, LinkTally] = {}

    def observe(self, request_line: str, headers: Mapping[str, str], fate: str) -> None:
        if not request_line.startswith(CREATE):
            return
        key = headers.get("idempotency-key", "").lower()
        with self._lock:
            tally = self._keys.setdefault(key, LinkTally())
            if fate in LOST:
                tally.lost += 1
            elif fate == UNSURE:
                tally.unsure += 1
            else:
                tally.forwarded += 1
                tally.answer_lost += fate in ANSWER_LOST

    def split(self, keys: Iterable[str]) -> tuple[LinkTally, LinkTally]:
        """(the creates of ``keys``, the creates of every other key)."""
        chosen = {key.lower() for key in keys}
        inside, outside = LinkTally(), LinkTally()
        with self._lock:
            for key, tally in self._keys.items():
                (inside if key in chosen else outside).add(tally)
        return inside, outside


@dataclass(frozen=True)
class LinkLossCheck:
    """The proxy's tally of the transactions' creates against the audit's figures for the
    fleet's merchant over the run's days."""

    proxy: LinkTally
    lost_elsewhere: int  # lost creates of payments that never became transactions
    unseen: int  # the audit's unseen_attempts
    received: int  # the audit's numbered create events of those transactions

    @property
    def slack(self) -> int:
        return self.proxy.answer_lost + self.proxy.unsure

    @property
    def ok(self) -> bool:
        return self.proxy.lost <= self.unseen <= self.proxy.lost + self.slack

    @property
    def audit_rate(self) -> float:
        sent = self.unseen + self.received
        return self.unseen / sent if sent else 0.0


def check_link_loss(
    ledger: LinkLedger, outcomes: Mapping[str, str], *, audit_out: Path, merchant_id: str
) -> LinkLossCheck:
    """Compare the ledger with the audit written to ``audit_out``; ``outcomes`` is what the
    terminals reported per key (``FleetResult.outcomes``)."""
    transactions = [key for key, status in outcomes.items() if status in TRANSACTION_STATUSES]
    proxy, elsewhere = ledger.split(transactions)
    unseen, received = audit_figures(audit_out, merchant_id)
    return LinkLossCheck(proxy, elsewhere.lost, unseen, received)


def audit_figures(audit_out: Path, merchant_id: str) -> tuple[int, int]:
    """(unseen_attempts, received attempts) of ``merchant_id`` over every day of the audit
    in ``audit_out``: daily_summary's unseen_attempts and the received_attempts of
    terminal_link_loss, read from the Parquet outputs (values as computed)."""
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    def total(table: str, column: str) -> int:
        rows = pq.read_table(audit_out / table, columns=["merchant_id", column]).to_pylist()
        return sum(int(row[column] or 0) for row in rows if row["merchant_id"] == merchant_id)

    unseen = total("daily_summary", "unseen_attempts")
    return unseen, total("terminal_link_loss", "received_attempts")


def days_between(first: date, last: date) -> list[date]:
    return [first + timedelta(days=offset) for offset in range((last - first).days + 1)]


def audit_run(lake: Path, out: Path, days: list[date]) -> None:
    """Export ``days`` of the configured database to ``lake`` and run the Spark audit
    over them into ``out`` (quietly: ``idempay simulate`` prints only the comparison)."""
    import asyncio

    from analytics.jobs.daily_audit import run_audit
    from analytics.session import build_session
    from api.config import Settings
    from api.db import create_engine
    from api.events.export import export_day

    async def export() -> None:
        engine = create_engine(Settings())
        try:
            for day in days:
                await export_day(engine, lake, day)
        finally:
            await engine.dispose()

    asyncio.run(export())
    spark = build_session()
    try:
        run_audit(spark, lake=str(lake), out=out, start=days[0], end=days[-1])
    finally:
        spark.stop()


def render_link_check(check: LinkLossCheck) -> str:
    """The comparison, a line each, and the verdict."""
    proxy = check.proxy
    verdict = (
        "agree"
        if check.ok
        else f"DISAGREE: unseen should be in [{proxy.lost}, {proxy.lost + check.slack}]"
    )
    lines = [
        "link loss, the audit against the chaos proxy (creates of payments that became "
        "transactions):",
        f"  proxy: lost before the server {proxy.lost}, forwarded {proxy.forwarded} "
        f"(answer lost {proxy.answer_lost}), unsure {proxy.unsure}; "
        f"lost on other payments {check.lost_elsewhere}; rate {proxy.rate:.4%}",
        f"  audit: unseen_attempts {check.unseen}, received {check.received}; "
        f"link_loss_rate {check.audit_rate:.4%}",
        f"  link loss: {verdict}",
    ]
    return "\n".join(lines)
