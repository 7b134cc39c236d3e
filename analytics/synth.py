"""``idempay lake synth``: a realistic lake without a server, for demos and benchmarks.

A fleet of merchants and terminals, each terminal on one link (GPRS, 3G, 4G, Wi-Fi,
Ethernet) with its own loss rate and latency. Every payment follows the terminal protocol
of SPEC §4 and leaves the request events the server would record (SPEC §5), plus the
transaction and ledger rows of what was processed:

- a lost request ⇒ in doubt ⇒ lookup ``not_found`` ⇒ resend the same key (scenario B);
- a lost response ⇒ in doubt ⇒ lookup ``found`` (scenario A), or a retry ``replayed``;
- an impatient resend while the first is processing ⇒ ``in_progress``, then ``replayed``;
- a slow issuer ⇒ 202 (outcome ``created``), lookups ``processing`` then ``found``;
- a terminal that gives up ⇒ abort (``aborted``, or ``already_processed``);
- client bugs: a new key minted after a lost response (a real double charge: the audit's
  suspects) and a key reused with another amount (``key_reused``);
- declines, reversals, refunds, expired requests, rejected bodies and 503s.

Deterministic for a (seed, start, days, events_per_day). ``--violations K`` plants K
duplicate charge entries, to see the report's red banner; the default is 0, as on a
healthy server.
"""

from __future__ import annotations

import hashlib
import random
import uuid
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path

import pyarrow as pa

from analytics.lake import TABLES, write_partition

Row = tuple[object, ...]

# (name, share of terminals, loss per request, median latency ms)
NETWORKS = [
    ("gprs", 0.35, 0.035, 450.0),
    ("3g", 0.25, 0.02, 220.0),
    ("4g", 0.22, 0.008, 110.0),
    ("wifi", 0.12, 0.004, 60.0),
    ("ethernet", 0.06, 0.001, 35.0),
]
AMOUNTS = [500, 990, 1250, 1500, 1990, 2500, 3490, 4990, 7500, 9990, 12900, 19990, 45000]


@dataclass(frozen=True, slots=True)
class SynthConfig:
    lake: Path
    days: int = 7
    events_per_day: int = 10_000
    seed: int = 1
    start: date = date(2026, 11, 1)
    merchants: int = 4
    terminals_per_merchant: int = 30
    violations: int = 0


@dataclass(frozen=True, slots=True)
class Terminal:
    merchant_id: str
    terminal_id: str
    network: str
    loss: float
    latency_ms: float


@dataclass
class SynthResult:
    events: int = 0
    transactions: int = 0
    ledger_entries: int = 0
    # (the later one's date, first key, second key) of every new-key double charge
    planted_double_charges: list[tuple[date, str, str]] = field(default_factory=list)
    planted_violations: int = 0
    files: list[Path] = field(default_factory=list)


class _Day:
    """Rows bucketed by their UTC date (a payment near midnight spills into the next day)."""

    def __init__(self) -> None:
        self.rows: dict[str, dict[date, list[Row]]] = {t: defaultdict(list) for t in TABLES}

    def add(self, table: str, moment: datetime, row: Row) -> None:
        self.rows[table][moment.date()].append(row)

    def pop(self, day: date) -> dict[str, list[Row]]:
        return {table: by_day.pop(day, []) for table, by_day in self.rows.items()}


class Fleet:
    def __init__(self, config: SynthConfig) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        self.out = _Day()
        self.result = SynthResult()
        self.terminals = self._terminals()

    # ------------------------------------------------------------ identities
    def _uuid(self) -> str:
        return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))

    def _terminals(self) -> list[Terminal]:
        terminals = []
        weights = [share for _, share, _, _ in NETWORKS]
        for m in range(self.config.merchants):
            merchant_id = (
                "mer_" + hashlib.sha256(f"{self.config.seed}:{m}".encode()).hexdigest()[:20]
            )
            for t in range(self.config.terminals_per_merchant):
                name, _, loss, latency = self.rng.choices(NETWORKS, weights)[0]
                terminals.append(Terminal(merchant_id, f"T-{t + 1:04d}", name, loss, latency))
        return terminals

    def _card(self, terminal: Terminal) -> str:
        token = f"{terminal.merchant_id}:card:{self.rng.randrange(200_000)}"
        return hashlib.sha256(token.encode()).hexdigest()

    def _latency(self, terminal: Terminal, *, slow: bool = False) -> float:
        base = 5_000.0 if slow else terminal.latency_ms
        return round(base * self.rng.lognormvariate(0.0, 0.35), 3)

    # ---------------------------------------------------------------- events
    def _event(
        self,
        terminal: Terminal,
        key: str,
        at: datetime,
        endpoint: str,
        outcome: str,
        status: int,
        *,
        attempt: int | None = None,
        slow: bool = False,
        terminal_known: bool = True,
    ) -> datetime:
        latency = self._latency(terminal, slow=slow)
        ts = at + timedelta(milliseconds=latency)
        row: Row = (
            self._uuid(),
            ts,
            terminal.merchant_id,
            terminal.terminal_id if terminal_known else None,
            key,
            endpoint,
            outcome,
            status,
            attempt,
            terminal.network,
            latency,
        )
        self.out.add("request_events", ts, row)
        self.result.events += 1
        return ts

    def _transaction(
        self,
        terminal: Terminal,
        key: str,
        created_at: datetime,
        *,
        card: str,
        amount: int,
        kind: str,
        approved: bool,
        reversible: bool = True,
    ) -> str:
        """The transaction row and its ledger entries; returns its final status."""
        processed_at = created_at + timedelta(milliseconds=self.rng.uniform(5, 40))
        reversed_at = None
        status = "approved" if approved else "declined"
        if approved and kind == "purchase" and reversible and self.rng.random() < 0.004:
            status, reversed_at = (
                "reversed",
                processed_at + timedelta(seconds=self.rng.uniform(20, 90)),
            )
            self._event(terminal, key, reversed_at, "reversal", "reversed", 200)
            self._entry(terminal, key, reversed_at, -amount, "reversal")
        row: Row = (
            key,
            terminal.merchant_id,
            terminal.terminal_id,
            kind,
            amount,
            "BRL",
            card,
            status,
            created_at,
            processed_at,
            reversed_at,
        )
        self.out.add("transactions", created_at, row)
        self.result.transactions += 1
        if approved:
            self._entry(
                terminal,
                key,
                processed_at,
                amount if kind == "purchase" else -amount,
                "charge" if kind == "purchase" else "refund",
            )
        return status

    def _entry(self, terminal: Terminal, key: str, at: datetime, amount: int, kind: str) -> None:
        row: Row = (self._uuid(), key, terminal.merchant_id, amount, "BRL", kind, at)
        self.out.add("ledger_entries", at, row)
        self.result.ledger_entries += 1

    # -------------------------------------------------------------- payments
    def payment(self, terminal: Terminal, at: datetime) -> None:
        """One payment through the SDK protocol, with this terminal's link faults."""
        rng = self.rng
        key = self._uuid()
        card, amount = self._card(terminal), rng.choice(AMOUNTS)
        kind = "refund" if rng.random() < 0.02 else "purchase"
        approved = rng.random() >= 0.06
        roll = rng.random()
        if roll < 0.0005:  # captured_at past the retention window
            self._event(terminal, key, at, "create", "expired", 410, attempt=1)
            return
        if roll < 0.0015:  # invalid body: nothing stored
            self._event(
                terminal, key, at, "create", "rejected", 422, attempt=1, terminal_known=False
            )
            return
        if roll < 0.0025:  # lost request, the customer leaves: abort fences the key
            at += timedelta(seconds=rng.uniform(10, 30))
            self._event(terminal, key, at, "lookup", "not_found", 404, terminal_known=False)
            self._event(
                terminal,
                key,
                at + timedelta(seconds=30),
                "abort",
                "aborted",
                200,
                terminal_known=False,
            )
            return
        slow = roll < 0.0125
        processed, txn_status = False, ""
        for attempt in range(1, 6):
            fault = rng.random()
            if fault < 0.0005:  # storage hiccup: 503, safe to retry
                at = self._event(terminal, key, at, "create", "error", 503, attempt=attempt)
                at += timedelta(seconds=1)
                continue
            lost_request = fault < terminal.loss / 2
            lost_response = terminal.loss / 2 <= fault < terminal.loss
            if lost_request:
                at += timedelta(seconds=rng.uniform(8, 15))  # client timeout
                if processed:  # an earlier attempt went through: the lookup finds it
                    self._event(terminal, key, at, "lookup", "found", 200)
                    return
                at = self._event(
                    terminal, key, at, "lookup", "not_found", 404, terminal_known=False
                )
                at += timedelta(seconds=rng.uniform(0.2, 2))
                continue
            outcome = "replayed" if processed else "created"
            status = 201 if not slow or processed else 202
            start = at
            ts = self._event(
                terminal,
                key,
                at,
                "create",
                outcome,
                status,
                attempt=attempt,
                slow=slow and not processed,
            )
            if not processed:
                processed = True
                txn_status = self._transaction(
                    terminal, key, start, card=card, amount=amount, kind=kind, approved=approved
                )
                if rng.random() < 0.003:  # impatient resend while processing
                    self._event(
                        terminal,
                        key,
                        start + timedelta(milliseconds=5),
                        "create",
                        "in_progress",
                        409,
                        attempt=attempt + 1,
                    )
            if slow and status == 202:
                for _ in range(rng.randint(1, 2)):
                    ts = self._event(
                        terminal, key, ts + timedelta(seconds=1), "lookup", "processing", 202
                    )
                self._event(terminal, key, ts + timedelta(seconds=1), "lookup", "found", 200)
                return
            if not lost_response:
                self._after(terminal, key, ts)
                return
            at = ts + timedelta(seconds=rng.uniform(8, 15))
            if rng.random() < 0.05 and kind == "purchase" and txn_status == "approved":
                self._new_key_bug(terminal, key, at, card, amount)  # buggy firmware
                return
            if rng.random() < 0.5:  # scenario A: the lookup finds it
                self._event(terminal, key, at, "lookup", "found", 200)
                return
        if not processed:  # gave up after five attempts: fence the key
            self._event(terminal, key, at, "abort", "aborted", 200, terminal_known=False)

    def _after(self, terminal: Terminal, key: str, at: datetime) -> None:
        if self.rng.random() < 0.001:  # client bug: same key, another amount
            self._event(
                terminal, key, at + timedelta(seconds=20), "create", "key_reused", 422, attempt=2
            )
        elif self.rng.random() < 0.001:  # a late abort finds the payment done
            self._event(terminal, key, at + timedelta(seconds=5), "abort", "already_processed", 200)

    def _new_key_bug(
        self, terminal: Terminal, original: str, at: datetime, card: str, amount: int
    ) -> None:
        """The terminal lost the response and minted a new key: charged twice."""
        key = self._uuid()
        self._event(terminal, key, at, "create", "created", 201, attempt=1)
        self._transaction(
            terminal,
            key,
            at,
            card=card,
            amount=amount,
            kind="purchase",
            approved=True,
            reversible=False,
        )
        self.result.planted_double_charges.append((at.date(), original, key))

    # ----------------------------------------------------------------- days
    def day_payments(self, day: date) -> None:
        start = datetime.combine(day, time.min, tzinfo=UTC)
        target = self.result.events + self.config.events_per_day
        while self.result.events < target:
            hour = self.rng.triangular(0, 24, 14)  # busier in the afternoon
            self.payment(self.rng.choice(self.terminals), start + timedelta(hours=hour))

    def plant_violations(self, rows: list[Row]) -> list[Row]:
        planted = []
        charges = [r for r in rows if r[5] == "charge"]
        for row in self.rng.sample(charges, min(self.config.violations, len(charges))):
            planted.append((self._uuid(), *row[1:6], row[6] + timedelta(seconds=1)))
        self.result.planted_violations += len(planted)
        return planted


def _batches(table: str, rows: list[Row]) -> Iterator[pa.RecordBatch]:
    schema = TABLES[table]
    for offset in range(0, len(rows), 100_000):
        chunk = rows[offset : offset + 100_000]
        columns = list(zip(*chunk, strict=True))
        arrays = [pa.array(col, type=f.type) for col, f in zip(columns, schema, strict=True)]
        yield pa.RecordBatch.from_arrays(arrays, schema=schema)


def synthesize(config: SynthConfig) -> SynthResult:
    fleet = Fleet(config)
    days = [config.start + timedelta(days=i) for i in range(config.days)]
    for i, day in enumerate(days):
        fleet.day_payments(day)
        tables = fleet.out.pop(day)
        if i == 0 and config.violations:
            tables["ledger_entries"].extend(fleet.plant_violations(tables["ledger_entries"]))
        for table, rows in tables.items():
            path, _ = write_partition(config.lake, table, day, _batches(table, rows))
            fleet.result.files.append(path)
    spill = config.start + timedelta(days=config.days)  # payments that ran past midnight
    tables = fleet.out.pop(spill)
    if any(tables.values()):
        for table, rows in tables.items():
            path, _ = write_partition(config.lake, table, spill, _batches(table, rows))
            fleet.result.files.append(path)
    return fleet.result
