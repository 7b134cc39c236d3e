"""``idempay lake synth``: a realistic lake without a server, for demos and benchmarks.

A fleet of merchants and terminals, each terminal on one link (GPRS, 3G, 4G, Wi-Fi,
Ethernet) with its own loss rate and latency. Every payment follows the terminal protocol
of contract §4 and leaves the request events the server would record (contract §5), plus the
transaction and ledger rows of what was processed (``analytics.synth_fleet``: the
protocol's paths, vectorised with numpy; the rows become Arrow columns without a Python
object per row, so 10 M events take well under a minute).

Each day's payments run in batches until the day has ``events_per_day`` events; rows are
bucketed by their own UTC date (a payment near midnight spills into the next day) and a
day is written once no later payment can add to it. Deterministic for a (seed, start,
days, events_per_day, merchants, terminals). ``--violations K`` plants K duplicate charge
entries on the first day, to see the report's red banner; the default is 0, as on a
healthy server. Offline sales and the duplicate guard's blocks and overrides are planted
always (``analytics.synth_fleet``); ``SynthResult`` keeps each, the audit's known answers.

The acquirer's side too (lake schema 3): each transaction has an ``rrn``, an approval its
``authorization_code``, a decline its ``decline_reason`` (5 % of declines
``acquirer_timeout``: the acquirer approved, the answer was lost, the reversal advice
reversed it), and every day of the range has its clearing partition
(``analytics.clearing``): one row per authorization the acquirer approved — approved,
reversed (``reversed_at`` set) and timed-out sales — so a synthesized week reconciles with
0 exceptions. The acquirer approves a millisecond before our server commits; a payment
that our server finished past the range's last midnight was approved at the acquirer
within the range (its row is in the last day's clearing: the day boundary).
Drawn from a random stream of its own, so the other tables are the same as without it.

Every partition it writes carries the ``_SYNTHESIZED`` marker (``analytics.manifest``), so
the report marks its days as synthesized, not real traffic.
"""

from __future__ import annotations

import hashlib
import math
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from analytics import clearing, manifest
from analytics.lake import TABLES, write_partition
from analytics.synth_fleet import (
    CARDS_PER_MERCHANT,
    ENDPOINTS,
    ENTRY_KINDS,
    KINDS,
    OUTCOMES,
    SECOND,
    TXN_STATUSES,
    Batch,
    Ints,
    Links,
)

# (name, share of terminals, loss per request, median latency ms)
NETWORKS = [
    ("gprs", 0.35, 0.035, 450.0),
    ("3g", 0.25, 0.02, 220.0),
    ("4g", 0.22, 0.008, 110.0),
    ("wifi", 0.12, 0.004, 60.0),
    ("ethernet", 0.06, 0.001, 35.0),
]
DAY = 86_400 * SECOND
EVENTS_PER_PAYMENT = 1.1  # a first guess for a batch's size; the loop tops the day up
_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
_RRN_ALPHABET = np.frombuffer(b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ", dtype=np.uint8)
_DIGITS = np.frombuffer(b"0123456789", dtype=np.uint8)
DECLINE_REASONS = ["insufficient_funds", "do_not_honour", "acquirer_timeout"]
DECLINE_SHARES = [0.6, 0.35, 0.05]
APPROVED, DECLINED, REVERSED = range(3)  # synth_fleet.TXN_STATUSES
ADVICE_DELAY_S = (1.0, 30.0)


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


@dataclass
class SynthResult:
    events: int = 0
    transactions: int = 0
    ledger_entries: int = 0
    # (the later one's date, first key, second key) of every new-key double charge
    planted_double_charges: list[tuple[date, str, str]] = field(default_factory=list)
    planted_violations: int = 0
    # offline advices (issue 16): one per sale, on the day the server processed it
    planted_offline: list[OfflineSale] = field(default_factory=list)
    # the duplicate guard (issue 17): (day, key) of each block and of each override
    planted_blocks: list[tuple[date, str]] = field(default_factory=list)
    planted_overrides: list[tuple[date, str]] = field(default_factory=list)
    clearing_rows: int = 0
    files: list[Path] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class OfflineSale:
    """A planted offline sale: the known answer the audit must find."""

    day: date  # created_at's UTC date: when the server processed the advice
    key: str
    forward_delay_s: float  # created_at − captured_at
    declined: bool
    amount: int  # BRL minor units
    forwarded_after_day_end: bool  # sold on an earlier UTC day


def _strings(raw: np.ndarray) -> pa.StringArray:
    """Rows of a 2-D uint8 array (ASCII, fixed width) as an Arrow string array, no copy
    per row."""
    n, width = raw.shape
    offsets = np.arange(0, width * (n + 1), width, dtype=np.int32)
    data = np.ascontiguousarray(raw)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(data))


def _hex(raw: np.ndarray) -> np.ndarray:
    out = np.empty((raw.shape[0], raw.shape[1] * 2), np.uint8)
    out[:, 0::2], out[:, 1::2] = _HEX[raw >> 4], _HEX[raw & 15]
    return out


def uuid4_strings(rng: np.random.Generator, n: int) -> pa.StringArray:
    """``n`` random UUIDv4 strings (canonical 8-4-4-4-12 form)."""
    raw = rng.integers(0, 256, size=(n, 16), dtype=np.uint8)
    raw[:, 6] = (raw[:, 6] & 0x0F) | 0x40
    raw[:, 8] = (raw[:, 8] & 0x3F) | 0x80
    hexed = _hex(raw)
    out = np.full((n, 36), ord("-"), np.uint8)
    for (a, b), (c, d) in zip(
        [(0, 8), (9, 13), (14, 18), (19, 23), (24, 36)],
        [(0, 8), (8, 12), (12, 16), (16, 20), (20, 32)],
        strict=True,
    ):
        out[:, a:b] = hexed[:, c:d]
    return _strings(out)


class Fleet:
    """The fleet's identities, drawn once: merchants, terminals and their links, cards."""

    def __init__(self, config: SynthConfig) -> None:
        self.config = config
        self.rng = np.random.default_rng(config.seed)
        m, per = config.merchants, config.terminals_per_merchant
        self.merchant_names = pa.array(
            [
                "mer_" + hashlib.sha256(f"{config.seed}:{i}".encode()).hexdigest()[:20]
                for i in range(m)
            ]
        )
        self.terminal_names = pa.array([f"T-{t + 1:04d}" for _ in range(m) for t in range(per)])
        shares = np.array([share for _, share, _, _ in NETWORKS])
        network = self.rng.choice(len(NETWORKS), size=m * per, p=shares / shares.sum())
        self.links = Links(
            merchant=np.repeat(np.arange(m, dtype=np.int64), per),
            network=network.astype(np.int64),
            loss=np.array([n[2] for n in NETWORKS])[network],
            latency_ms=np.array([n[3] for n in NETWORKS])[network],
        )
        self.network_names = pa.array([n[0] for n in NETWORKS])
        cards = self.rng.integers(0, 256, size=(m * CARDS_PER_MERCHANT, 32), dtype=np.uint8)
        self.fingerprints = _strings(_hex(cards))
        self.acquirer_rng = np.random.default_rng([config.seed, 8583])
        self.last_micros = (
            int(datetime.combine(config.start, datetime.min.time(), tzinfo=UTC).timestamp())
            + 86_400 * config.days
        ) * SECOND - 1  # the range's last microsecond

    def batch(self, day: date, n: int) -> Batch:
        start = int(datetime.combine(day, datetime.min.time(), tzinfo=UTC).timestamp()) * SECOND
        term = self.rng.integers(0, len(self.links.loss), n)
        hours = self.rng.triangular(0, 14, 24, n)  # busier in the afternoon
        batch = Batch(self.rng, self.links, term, start + (hours * 3600 * SECOND).astype(np.int64))
        batch.run()
        return batch


def _take(names: pa.Array, codes: np.ndarray, mask: np.ndarray | None = None) -> pa.Array:
    return names.take(pa.array(codes.astype(np.int64), mask=mask))


def _ts(micros: np.ndarray, mask: np.ndarray | None = None) -> pa.Array:
    return pa.array(micros, type=pa.timestamp("us", tz="UTC"), mask=mask)


class Rows:
    """A batch's rows as Arrow tables, each with the UTC day number of its rows."""

    def __init__(self, fleet: Fleet, batch: Batch) -> None:
        self.fleet, self.batch = fleet, batch
        self.keys = uuid4_strings(fleet.rng, batch.next_key)

    def _merchant(self, pay: Ints) -> pa.Array:
        return _take(self.fleet.merchant_names, self.fleet.links.merchant[self.batch.term[pay]])

    def events(self) -> tuple[pa.Table, np.ndarray]:
        e, fleet = self.batch.events, self.fleet
        pay, key, ts = (
            e.concat("pay", np.int64),
            e.concat("key", np.int64),
            e.concat("ts", np.int64),
        )
        term, attempt = self.batch.term[pay], e.concat("attempt", np.int32)
        columns = [
            uuid4_strings(fleet.rng, len(pay)),
            _ts(ts),
            self._merchant(pay),
            _take(fleet.terminal_names, term, mask=~e.concat("known", np.bool_)),
            self.keys.take(pa.array(key)),
            _take(pa.array(ENDPOINTS), e.concat("endpoint", np.int64)),
            _take(pa.array(OUTCOMES), e.concat("outcome", np.int64)),
            pa.array(e.concat("status", np.int32)),
            pa.array(attempt, mask=attempt == 0),
            _take(fleet.network_names, fleet.links.network[term]),
            pa.array(e.concat("latency", np.float64)),
        ]
        return pa.Table.from_arrays(columns, schema=TABLES["request_events"]), ts // DAY

    def transactions(self) -> tuple[pa.Table, np.ndarray]:
        t, fleet, batch = self.batch.txns, self.fleet, self.batch
        pay, created = t.concat("pay", np.int64), t.concat("created", np.int64)
        reversed_at = t.concat("reversed_at", np.int64)
        captured = t.concat("captured", np.int64)
        card = fleet.links.merchant[batch.term[pay]] * CARDS_PER_MERCHANT + batch.card[pay]
        status = t.concat("status", np.int64)
        acquirer = self._acquirer(status)
        columns = [
            self.keys.take(pa.array(t.concat("key", np.int64))),
            self._merchant(pay),
            _take(fleet.terminal_names, batch.term[pay]),
            _take(pa.array(KINDS), t.concat("kind", np.int64)),
            pa.array(batch.amount[pay]),
            _take(pa.array(["BRL"]), np.zeros(len(pay), np.int64)),
            fleet.fingerprints.take(pa.array(card)),
            _take(pa.array(TXN_STATUSES), t.concat("status", np.int64)),
            _ts(created),
            _ts(t.concat("processed", np.int64)),
            _ts(reversed_at, mask=reversed_at < 0),
            pa.array(t.concat("offline", np.bool_)),
            _ts(captured, mask=captured < 0),
            pa.array(t.concat("override", np.bool_)),
            acquirer.rrn,
            acquirer.authorization_code,
            acquirer.decline_reason,
        ]
        self.cleared = self._clearing(columns, status, acquirer)
        return pa.Table.from_arrays(columns, schema=TABLES["transactions"]), created // DAY

    def _acquirer(self, status: np.ndarray) -> Acquirer:
        rng, n = self.fleet.acquirer_rng, len(status)
        declined = status == DECLINED
        reason = rng.choice(len(DECLINE_REASONS), size=n, p=DECLINE_SHARES)
        return Acquirer(
            rrn=_strings(_RRN_ALPHABET[rng.integers(0, 36, (n, 12))]),
            authorization_code=pc.if_else(
                pa.array(declined),
                pa.scalar(None, pa.string()),
                _strings(_DIGITS[rng.integers(0, 10, (n, 6))]),
            ),
            decline_reason=_take(pa.array(DECLINE_REASONS), reason, mask=~declined),
            timed_out=declined & (reason == DECLINE_REASONS.index("acquirer_timeout")),
            stan=_strings(_DIGITS[rng.integers(0, 10, (n, 6))]),
            advice_delay=(rng.uniform(*ADVICE_DELAY_S, n) * SECOND).astype(np.int64),
        )

    def _clearing(
        self, columns: list[pa.Array], status: np.ndarray, acquirer: Acquirer
    ) -> tuple[pa.Table, np.ndarray]:
        """The acquirer's clearing rows of these transactions, and their UTC day numbers:
        every authorization it approved (approved, reversed, timed out then reversed by
        the advice), approved 1 ms before our server processed it (within the range)."""
        t = self.batch.txns
        processed = t.concat("processed", np.int64)
        approved_at = np.minimum(processed - 1_000, self.fleet.last_micros)
        reversed_at = np.where(
            status == REVERSED,
            t.concat("reversed_at", np.int64),
            np.where(acquirer.timed_out, approved_at + acquirer.advice_delay, -1),
        )
        kept = (status != DECLINED) | acquirer.timed_out
        refund = t.concat("kind", np.int64) == KINDS.index("refund")
        rows = [
            acquirer.rrn,
            acquirer.stan,
            columns[1],
            columns[2],
            pa.array(np.where(refund, "200000", "000000")),
            columns[4],
            columns[5],
            acquirer.authorization_code,
            _ts(approved_at),
            _ts(reversed_at, mask=reversed_at < 0),
        ]
        table = pa.Table.from_arrays(rows, schema=clearing.CLEARING).filter(pa.array(kept))
        return table, (approved_at // DAY)[kept]

    def ledger(self) -> tuple[pa.Table, np.ndarray]:
        le = self.batch.entries
        pay, created = le.concat("pay", np.int64), le.concat("created", np.int64)
        columns = [
            uuid4_strings(self.fleet.rng, len(pay)),
            self.keys.take(pa.array(le.concat("key", np.int64))),
            self._merchant(pay),
            pa.array(le.concat("amount", np.int64)),
            _take(pa.array(["BRL"]), np.zeros(len(pay), np.int64)),
            _take(pa.array(ENTRY_KINDS), le.concat("kind", np.int64)),
            _ts(created),
        ]
        return pa.Table.from_arrays(columns, schema=TABLES["ledger_entries"]), created // DAY

    def offline_sales(self) -> list[OfflineSale]:
        batch, planted = self.batch, []
        for key, captured, forwarded in batch.offline_sales:
            names = self.keys.take(pa.array(key)).to_pylist()
            for name, k, sold, sent in zip(
                names, key.tolist(), captured.tolist(), forwarded.tolist(), strict=True
            ):
                planted.append(
                    OfflineSale(
                        day=_day(sent),
                        key=name,
                        forward_delay_s=(sent - sold) / 1_000_000.0,
                        declined=not bool(batch.approved[k]),
                        amount=int(batch.amount[k]),
                        forwarded_after_day_end=sold // DAY < sent // DAY,
                    )
                )
        return planted

    def guard(self) -> tuple[list[tuple[date, str]], list[tuple[date, str]]]:
        """(day, key) of the guard's blocks and of the cashier's overrides."""
        blocks = [self._dated(keys, ats) for keys, ats in self.batch.guard_blocks]
        overrides = [self._dated(keys, ats) for _, keys, ats in self.batch.override_keys]
        return [p for part in blocks for p in part], [p for part in overrides for p in part]

    def _dated(self, keys: Ints, ats: Ints) -> list[tuple[date, str]]:
        names = self.keys.take(pa.array(keys)).to_pylist()
        return [(_day(at), name) for name, at in zip(names, ats.tolist(), strict=True)]

    def double_charges(self) -> list[tuple[date, str, str]]:
        planted: list[tuple[date, str, str]] = []
        for original, new, at in [*self.batch.bug_keys, *self.batch.override_keys]:
            firsts = self.keys.take(pa.array(original)).to_pylist()
            seconds = self.keys.take(pa.array(new)).to_pylist()
            days = [datetime.fromtimestamp(a / SECOND, UTC).date() for a in at.tolist()]
            planted.extend(zip(days, firsts, seconds, strict=True))
        return planted


@dataclass(frozen=True, slots=True)
class Acquirer:
    """The acquirer's columns of a batch's transactions (``Rows._acquirer``)."""

    rrn: pa.Array
    authorization_code: pa.Array
    decline_reason: pa.Array
    timed_out: np.ndarray
    stan: pa.Array
    advice_delay: np.ndarray


def _day(micros: int) -> date:
    return date(1970, 1, 1) + timedelta(days=micros // DAY)


def _plant_violations(rng: np.random.Generator, ledger: pa.Table, k: int, day: date) -> pa.Table:
    """``k`` second charge entries for charges of ``day`` (1 s later, still that day)."""
    end = datetime.combine(day + timedelta(days=1), datetime.min.time(), tzinfo=UTC)
    last = pa.scalar(end - timedelta(seconds=1), type=pa.timestamp("us", tz="UTC"))
    is_charge = pc.and_(pc.equal(ledger["kind"], "charge"), pc.less(ledger["created_at"], last))
    charges = ledger.filter(is_charge)
    chosen = charges.take(
        pa.array(rng.choice(charges.num_rows, min(k, charges.num_rows), replace=False))
    )
    later = pc.add(chosen["created_at"], pa.scalar(timedelta(seconds=1)))
    return chosen.set_column(0, "entry_id", uuid4_strings(rng, chosen.num_rows)).set_column(
        6, "created_at", later
    )


def synthesize(config: SynthConfig) -> SynthResult:
    fleet, result = Fleet(config), SynthResult()
    pending: dict[int, dict[str, list[pa.Table]]] = defaultdict(lambda: defaultdict(list))
    epoch_day = (config.start - date(1970, 1, 1)).days

    def write(day_number: int) -> None:
        day = date(1970, 1, 1) + timedelta(days=day_number)
        tables = {
            t: pa.concat_tables(pending[day_number][t] or [TABLES[t].empty_table()]) for t in TABLES
        }
        cleared = pending.pop(day_number, {}).get(clearing.TABLE, [])
        if epoch_day <= day_number < epoch_day + config.days:  # every day has its file
            rows = pa.concat_tables(cleared or [clearing.CLEARING.empty_table()])
            landed = clearing.land_rows(config.lake, day, rows, source_name="synthesized")
            result.clearing_rows += rows.num_rows
            result.files.append(landed.path)
        if day == config.start and config.violations:
            planted = _plant_violations(fleet.rng, tables["ledger_entries"], config.violations, day)
            tables["ledger_entries"] = pa.concat_tables([tables["ledger_entries"], planted])
            result.planted_violations += planted.num_rows
            result.ledger_entries += planted.num_rows
        for table, rows in tables.items():
            path, _ = write_partition(config.lake, table, day, [rows])
            manifest.mark_synthesized(path.parent, by=f"analytics.synth seed {config.seed}")
            result.files.append(path)

    for offset in range(config.days):
        day, produced = config.start + timedelta(days=offset), 0
        while produced < config.events_per_day:
            remaining = config.events_per_day - produced
            batch = fleet.batch(day, math.ceil(remaining / EVENTS_PER_PAYMENT) + 8)
            rows = Rows(fleet, batch)
            for table, (rows_table, days) in {
                "request_events": rows.events(),
                "transactions": rows.transactions(),
                "ledger_entries": rows.ledger(),
            }.items():
                for number in np.unique(days).tolist():
                    pending[number][table].append(rows_table.filter(pa.array(days == number)))
                setattr(
                    result, _COUNTER[table], getattr(result, _COUNTER[table]) + rows_table.num_rows
                )
            cleared, days = rows.cleared
            for number in np.unique(days).tolist():
                pending[number][clearing.TABLE].append(cleared.filter(pa.array(days == number)))
            produced += len(batch.events.concat("ts", np.int64))
            result.planted_double_charges.extend(rows.double_charges())
            result.planted_offline.extend(rows.offline_sales())
            blocks, overrides = rows.guard()
            result.planted_blocks.extend(blocks)
            result.planted_overrides.extend(overrides)
        write(epoch_day + offset)
    for number in sorted(pending):  # payments that ran past the last midnight
        write(number)
    return result


_COUNTER = {
    "request_events": "events",
    "transactions": "transactions",
    "ledger_entries": "ledger_entries",
}
