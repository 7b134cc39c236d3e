"""The chaos run's link outage (issue 16): part of the fleet sells offline while its link is
fully down, and terminals are SIGKILLed while holding stored payments.

The outage is ``idempay simulate --outage``'s (``idempay_tools.simulate_outage``), not a
copy: every terminal of the run sells under ``OUTAGE_POLICY``; the terminals
``in_outage`` picks (``OUTAGE_SHARE`` of the fleet) get an ``OutageLink`` that refuses
every connection from ``outage_start`` for ``outage_s`` (unix times in their
``FleetConfig``, set when the fleet starts from the fault's slot in the plan, so that a
rebooted terminal process is in the same outage). Those terminals accept sales offline
(the journal holds them STORED) within the policy's limits, refuse the rest
(``OfflineLimitError``), and forward what they stored — same key, an advice — as soon as
the link is back (before their next sale), or from ``recover()`` at boot. The outage takes
the plan's first fault slot (``chaos.plan``): its window is fixed when the fleet starts,
so no earlier fault may overrun into it.

The fault (``chaos.Run._link_outage``) SIGKILLs two terminals of the outage holding stored
payments: one ``KILL_DURING`` into the outage (it reboots while the link is still down,
recovers what it can and sells offline on top of what it held: the limits count both),
one just before the link comes back (it reboots after: its ``recover()`` forwards). The
keys each held at its kill are read from its journal once it is dead (``Held``). Time
to recover: from the link's return until every terminal of the outage reported nothing
stored.

``check_offline`` — after the run, on the database and every journal (``OfflineCheck``;
each row must be 0):

- every payment sold offline (a journal entry whose request is an advice,
  ``entry_mode: offline``) ends forwarded — RESOLVED, with exactly one transaction on the
  server, with the journal's status and ``offline = true`` — or refused as the contract
  says (REPORTED: 422 ``advice_too_old`` or a fenced key; then no transaction); none left
  STORED;
- every key the SDK answered ``offline=True`` is such an entry (none dropped);
- every payment held by a killed terminal was forwarded or refused so (none lost across
  the kill);
- no offline key has two charges; no offline transaction on the server that no terminal
  stored;
- the risk limits held: no stored count or amount over the policy in anything a terminal
  reported, no offline sale over the floor limit.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from client_sdk import Journal, JournalEntry, JournalState, OfflinePolicy
from idempay_tools.simulate_outage import OUTAGE_POLICY, in_outage

__all__ = [
    "KILL_DURING",
    "advice_status",
    "forwarded_between",
    "is_advice",
    "OUTAGE_POLICY",
    "OUTAGE_SHARE",
    "Held",
    "OfflineCheck",
    "check_offline",
    "outage_indices",
    "stored_keys",
]

OUTAGE_SHARE = 0.5
KILL_DURING = 0.4  # the first victim dies this far into the outage
KILL_BEFORE_END_S = 0.3  # the second one this long before the link comes back
_CHUNK = 500
_REFUSALS = ("advice_too_old", "fenced")


def outage_indices(seed: int, terminals: int) -> list[int]:
    """The terminals that lose their link (``simulate --outage``'s choice)."""
    return [i for i in range(terminals) if in_outage(seed, i, terminals, OUTAGE_SHARE)]


def stored_keys(journal: Path) -> list[str]:
    """The payments ``journal`` holds STORED (sold offline, not yet forwarded)."""
    if not journal.exists():
        return []
    with Journal(journal) as opened:
        return [entry.key for entry in opened.stored()]


@dataclass
class Held:
    """A terminal SIGKILLed in the outage, and the stored payments it held then."""

    terminal: str
    when: str  # "40 % into the outage" | "just before the link came back"
    killed_at: float  # monotonic
    keys: list[str] = field(default_factory=list)


def is_advice(entry: JournalEntry) -> bool:
    try:
        return entry.request.get("entry_mode") == "offline"
    except ValueError:
        return False


def advice_status(entry: JournalEntry) -> str:
    """What became of a payment sold offline: the server's status once forwarded,
    ``refused`` (REPORTED), or ``stored`` (not forwarded yet)."""
    if entry.state is JournalState.REPORTED:
        return "refused"
    if entry.state is JournalState.RESOLVED:
        return str((entry.outcome or {}).get("status"))
    return "stored"


def forwarded_between(journals: Iterable[Path], windows: Sequence[tuple[float, float]]) -> set[str]:
    """Payments sold offline whose forward the journal recorded within one of ``windows``
    (unix times): a database restore in that window may have taken their transaction
    back (``restored_away``, as for payments reported then)."""
    found: set[str] = set()
    for path in journals:
        if not path.exists():
            continue
        with Journal(path) as journal:
            for entry in journal.entries():
                at = entry.updated_at.timestamp()
                if is_advice(entry) and any(a <= at <= b for a, b in windows):
                    found.add(entry.key)
    return found


def _refusal(entry: JournalEntry) -> str:
    outcome: Mapping[str, Any] = entry.outcome or {}
    if outcome.get("kind") == "fenced":
        return "fenced"
    return str(outcome.get("code") or outcome.get("kind") or "?")


@dataclass(frozen=True)
class OfflineCheck:
    sold_offline: int  # advices in the journals
    refused_by_limits: int  # OfflineLimitError: the policy said no (ABORTED, never sent)
    accepted_reported: int  # keys the SDK answered offline=True (as the terminals said)
    by_state: dict[str, int]  # forwarded approved / declined, refused: code, stored
    held: int  # stored payments held by killed terminals
    max_exposure: tuple[int, int]  # the largest stored count / amount a terminal reported
    forward_delay_s: tuple[float, float, float] | None  # p50, p95, max: created − captured
    left_stored: int
    not_once: int
    not_marked: int
    refused_processed: int
    refused_otherwise: int
    dropped: int
    held_lost: int
    charged_twice: int
    unknown_offline: int
    over_limits: int
    examples: tuple[str, ...] = ()

    def rows(self) -> list[tuple[str, int]]:
        """(check, violations) for the report's invariants."""
        return [
            ("offline: payments sold offline left stored (never forwarded)", self.left_stored),
            ("offline: forwarded payments not processed exactly once", self.not_once),
            ("offline: forwarded payments the server does not mark offline", self.not_marked),
            ("offline: refused advices that were processed anyway", self.refused_processed),
            (
                "offline: advices refused for a reason outside the contract",
                self.refused_otherwise,
            ),
            ("offline: payments the SDK accepted offline missing from its journal", self.dropped),
            ("offline: payments held by a killed terminal lost or doubled", self.held_lost),
            ("offline: keys with two charges", self.charged_twice),
            ("offline: offline transactions no terminal stored", self.unknown_offline),
            ("offline: risk limits exceeded", self.over_limits),
        ]

    def figures(self) -> list[tuple[str, str]]:
        states = ", ".join(f"{k} {v}" for k, v in sorted(self.by_state.items())) or "—"
        delay = (
            "p50 {:.1f} / p95 {:.1f} / max {:.1f} s".format(*self.forward_delay_s)
            if self.forward_delay_s
            else "—"
        )
        count, amount = self.max_exposure
        policy = OUTAGE_POLICY
        return [
            ("payments sold offline (journals)", str(self.sold_offline)),
            (
                "payments the offline policy refused (OfflineLimitError)",
                f"{self.refused_by_limits}",
            ),
            ("… answered offline=True (as the terminals reported)", str(self.accepted_reported)),
            ("… at the end", states),
            ("stored payments held by terminals SIGKILLed in the outage", str(self.held)),
            (
                "largest stored count / amount a terminal reported (limits)",
                f"{count} / {amount} ({policy.max_stored_count} / {policy.max_stored_amount})",
            ),
            ("forward delay on the server (created_at − captured_at)", delay),
        ]


async def check_offline(
    database_url: str,
    *,
    merchants: Sequence[str],
    journals: Iterable[Path],
    accepted: Mapping[str, str],
    held: Sequence[Held],
    exposures: Mapping[str, Sequence[tuple[float, int, int]]],
    restored_away: Collection[str] = frozenset(),
    policy: OfflinePolicy = OUTAGE_POLICY,
) -> OfflineCheck:
    """The offline invariants (module docstring) over ``journals`` and the database."""
    from sqlalchemy import func, select

    from api.config import Settings
    from api.db import create_engine
    from api.models import LedgerEntry, Transaction

    advices: dict[str, JournalEntry] = {}
    terminal_of: dict[str, str] = {}  # key → the journal's terminal (its file name)
    refused_by_limits = 0
    for path in journals:
        if path.exists():
            with Journal(path) as journal:
                for entry in journal.entries():
                    if is_advice(entry):
                        advices[entry.key] = entry
                        terminal_of[entry.key] = path.stem
                    elif (entry.outcome or {}).get("kind") == "offline_refused":
                        refused_by_limits += 1
    keys = list(advices)
    held_keys = {key for h in held for key in h.keys}
    found: dict[str, list[tuple[str, bool]]] = {}
    charges: Counter[str] = Counter()
    delays: list[float] = []
    engine = create_engine(Settings(database_url=database_url))
    try:
        async with engine.connect() as conn:
            for start in range(0, len(keys), _CHUNK):
                chunk = keys[start : start + _CHUNK]
                rows = await conn.execute(
                    select(Transaction.id, Transaction.status, Transaction.offline).where(
                        Transaction.merchant_id.in_(merchants), Transaction.id.in_(chunk)
                    )
                )
                for txn_id, status, offline in rows:
                    found.setdefault(str(txn_id), []).append((str(status), bool(offline)))
                counted = await conn.execute(
                    select(LedgerEntry.transaction_id, func.count())
                    .where(
                        LedgerEntry.merchant_id.in_(merchants),
                        LedgerEntry.kind == "charge",
                        LedgerEntry.transaction_id.in_(chunk),
                    )
                    .group_by(LedgerEntry.merchant_id, LedgerEntry.transaction_id)
                )
                charges.update({str(k): int(n) for k, n in counted})
            server_offline = await conn.execute(
                select(Transaction.id, Transaction.created_at, Transaction.captured_at).where(
                    Transaction.merchant_id.in_(merchants), Transaction.offline.is_(True)
                )
            )
            unknown = []
            for txn_id, created, captured in server_offline:
                if str(txn_id) not in advices:
                    unknown.append(str(txn_id))
                if created is not None and captured is not None:
                    delays.append((created - captured).total_seconds())
    finally:
        await engine.dispose()

    by_state: Counter[str] = Counter()
    examples: list[str] = []
    bad: Counter[str] = Counter()

    def fail(check: str, key: str, detail: str) -> None:
        bad[check] += 1
        if len(examples) < 20:
            where = f" ({terminal_of[key]})" if key in terminal_of else ""
            examples.append(f"{check} {key}{where}: {detail}")

    for key, entry in advices.items():
        held_txns = found.get(key, [])
        restored = key in restored_away and len(held_txns) <= 1
        if entry.state is JournalState.STORED:
            by_state["stored"] += 1
            why = (entry.outcome or {}).get("error") or ""
            captured = entry.request.get("captured_at")
            fail("left_stored", key, f"still STORED at the end (captured_at {captured}) {why}")
        elif entry.state is JournalState.RESOLVED:
            status = str((entry.outcome or {}).get("status"))
            by_state[f"forwarded {status}"] += 1
            if not restored and (len(held_txns) != 1 or held_txns[0][0] != status):
                fail("not_once", key, f"journal {status}, server {held_txns}")
            elif held_txns and not held_txns[0][1]:
                fail("not_marked", key, "transaction offline = false")
        elif entry.state is JournalState.REPORTED:
            reason = _refusal(entry)
            by_state[f"refused {reason}"] += 1
            if held_txns:
                fail("refused_processed", key, f"REPORTED ({reason}), server {held_txns}")
            if reason not in _REFUSALS:
                fail("refused_otherwise", key, f"REPORTED for {reason}")
        else:
            by_state[entry.state.value.lower()] += 1
            fail("left_stored", key, f"{entry.state.value} at the end")
        if charges.get(key, 0) > 1:
            fail("charged_twice", key, f"{charges[key]} charges")
        if int(entry.request.get("amount") or 0) > policy.floor_limit:
            fail("over_limits", key, f"amount over the floor limit {policy.floor_limit}")
    for key in sorted(set(accepted) - set(advices)):
        fail("dropped", key, f"answered offline on {accepted[key]}, no advice in its journal")
    for key in sorted(held_keys):
        advice = advices.get(key)
        txns = found.get(key, [])
        kept = advice is not None and (
            (advice.state is JournalState.RESOLVED and (len(txns) == 1 or key in restored_away))
            or (advice.state is JournalState.REPORTED and not txns)
        )
        if not kept:
            now = advice.state.value if advice is not None else "gone"
            fail("held_lost", key, f"held at a kill; now {now}, server {txns}")
    for key in unknown:
        fail("unknown_offline", key, "offline transaction with no advice in any journal")
    max_count = max_amount = 0
    for terminal, samples in exposures.items():
        for _, count, amount in samples:
            max_count, max_amount = max(max_count, count), max(max_amount, amount)
            if count > policy.max_stored_count or amount > policy.max_stored_amount:
                fail("over_limits", terminal, f"stored {count} / {amount}")
    delay = None
    if delays:
        ordered = sorted(delays)
        p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
        delay = (statistics.median(ordered), p95, ordered[-1])
    return OfflineCheck(
        sold_offline=len(advices),
        refused_by_limits=refused_by_limits,
        accepted_reported=len(accepted),
        by_state=dict(by_state),
        held=len(held_keys),
        max_exposure=(max_count, max_amount),
        forward_delay_s=delay,
        left_stored=bad["left_stored"],
        not_once=bad["not_once"],
        not_marked=bad["not_marked"],
        refused_processed=bad["refused_processed"],
        refused_otherwise=bad["refused_otherwise"],
        dropped=bad["dropped"],
        held_lost=bad["held_lost"],
        charged_twice=bad["charged_twice"],
        unknown_offline=bad["unknown_offline"],
        over_limits=bad["over_limits"],
        examples=tuple(examples),
    )


def all_forwarded_since(
    exposures: Mapping[str, Sequence[tuple[float, int, int]]],
    terminals: Iterable[str],
    since: float,
) -> float | None:
    """When every terminal in ``terminals`` had reported nothing stored at or after
    ``since`` (monotonic), or None while one has not."""
    last = 0.0
    for terminal in terminals:
        samples = list(exposures.get(terminal, ()))
        seen = next((t for t, n, _ in samples if t >= since and n == 0), None)
        if seen is None:
            return None
        last = max(last, seen)
    return last
