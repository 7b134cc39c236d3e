"""The synthetic fleet's payments, vectorised: numpy arrays of payments step through the
terminal protocol of contract §4 together (one numpy operation per step, never a Python loop
per payment), leaving the rows the server would record as column arrays.

The protocol, per payment (the same paths and probabilities as a terminal on its link):

- 0.05 % expired (``create expired``), 0.1 % rejected bodies, 0.1 % a lost request whose
  customer leaves (``lookup not_found`` then ``abort aborted``); 1 % slow issuers (202);
- up to five attempts, each: 0.05 % a 503 (``create error``, retry after 1 s); the link
  loses the request (loss ÷ 2: timeout, ``lookup not_found`` — or ``found`` if an earlier
  attempt went through — then resend) or the response (loss ÷ 2: after the timeout 5 % of
  approved purchases hit the new-key firmware bug — a second charge under a new key, what
  ``suspected_double_charges`` must find — half the rest settle by ``lookup found``, the
  others resend and get ``replayed``);
- a slow issuer answers 202 and the terminal polls ``processing`` once or twice before
  ``found``; 0.3 % impatient resends (``in_progress``); 0.1 % a key reused with another
  amount (``key_reused``), 0.1 % a late abort (``already_processed``);
- 6 % declined, 2 % refunds, 0.4 % of approved purchases reversed (event and entry);
- offline selling (issue 16): a purchase the terminal could not send at all is sold offline
  with a probability of 0.6 × its link's loss (GPRS ≈ 2 %), then forwarded as an advice 30 s
  to 12 h later (log-uniform; some cross midnight): one ``create created`` at the forward,
  a transaction with ``offline`` and ``captured_at`` (the sale), declined like any other
  (6 %: the merchant's loss); ``offline_sales`` keeps each (key, captured, forwarded);
- the duplicate guard (issue 17): 0.2 % of answered approved purchases are swiped again
  10–60 s later under a new key and blocked (``create rejected`` 409); half of those the
  cashier confirms 5–20 s later under another key: an approved purchase with
  ``duplicate_override`` — a real double charge, so also in ``override_keys`` (original,
  override, created_at) beside the firmware bug's ``bug_keys``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

Ints = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]
Floats = npt.NDArray[np.float64]

SECOND = 1_000_000  # timestamps are int64 microseconds since the epoch
ENDPOINTS = ["create", "lookup", "abort", "reversal"]
OUTCOMES = [
    "created", "replayed", "in_progress", "key_reused", "expired", "rejected", "error",
    "found", "processing", "not_found", "aborted", "already_processed", "reversed",
]  # fmt: skip
CREATE, LOOKUP, ABORT, REVERSAL = range(4)
OUT = {name: code for code, name in enumerate(OUTCOMES)}
KINDS = ["purchase", "refund"]
TXN_STATUSES = ["approved", "declined", "reversed"]
ENTRY_KINDS = ["charge", "refund", "reversal"]
AMOUNTS = np.array(
    [500, 990, 1250, 1500, 1990, 2500, 3490, 4990, 7500, 9990, 12900, 19990, 45000], np.int64
)
CARDS_PER_MERCHANT = 200_000
OFFLINE_PER_LOSS = 0.6  # share of a link's loss sold offline
FORWARD_DELAY_S = (30.0, 12 * 3600.0)
GUARD_SHARE, CONFIRMED_SHARE = 0.002, 0.5


@dataclass(frozen=True)
class Links:
    """Per terminal (index): merchant index, network code, loss per request, latency."""

    merchant: Ints
    network: Ints
    loss: Floats
    latency_ms: Floats


@dataclass
class Columns:
    """Rows of one table as growing lists of column chunks."""

    chunks: dict[str, list[npt.NDArray[Any]]] = field(default_factory=dict)

    def add(self, **columns: Any) -> None:
        n = next(len(v) for v in columns.values() if np.ndim(v) > 0)
        for name, values in columns.items():
            array = np.broadcast_to(values, (n,)) if np.ndim(values) == 0 else values
            self.chunks.setdefault(name, []).append(np.asarray(array))

    def concat(self, name: str, dtype: Any) -> npt.NDArray[Any]:
        parts = self.chunks.get(name, [])
        return np.concatenate(parts).astype(dtype, copy=False) if parts else np.empty(0, dtype)


class Batch:
    """A batch of payments starting at ``at`` (µs) on terminals ``term``, stepped through
    the protocol. Keys are indices: 0..n-1 the payments' own, n.. the keys the new-key
    firmware bug mints (``bug_keys``: original key → new key)."""

    def __init__(self, rng: np.random.Generator, links: Links, term: Ints, at: Ints) -> None:
        self.rng, self.links = rng, links
        self.n = len(term)
        self.term, self.start = term, at
        self.card = rng.integers(0, CARDS_PER_MERCHANT, self.n)
        self.amount = AMOUNTS[rng.integers(0, len(AMOUNTS), self.n)]
        self.refund = rng.random(self.n) < 0.02
        self.approved = rng.random(self.n) >= 0.06
        self.events, self.txns, self.entries = Columns(), Columns(), Columns()
        self.bug_keys: list[tuple[Ints, Ints, Ints]] = []  # (original, new, created_at)
        self.override_keys: list[tuple[Ints, Ints, Ints]] = []  # (original, new, created_at)
        self.offline_sales: list[tuple[Ints, Ints, Ints]] = []  # (key, captured, forwarded)
        self.guard_blocks: list[tuple[Ints, Ints]] = []  # (blocked key, ts)
        self.next_key = self.n

    # ------------------------------------------------------------------- rows
    def emit(
        self,
        key: Ints,
        at: Ints,
        endpoint: int,
        outcome: int | Ints,
        status: int | Ints,
        *,
        attempt: int | Ints = 0,
        slow: Bools | None = None,
        known: bool = True,
        pay: Ints | None = None,
    ) -> Ints:
        """Events of ``key`` sent at ``at``; returns when each was recorded (at + latency)."""
        payment = key if pay is None else pay
        base = self.links.latency_ms[self.term[payment]]
        if slow is not None:
            base = np.where(slow, 5_000.0, base)
        latency = np.round(base * self.rng.lognormal(0.0, 0.35, len(key)), 3)
        ts = at + (latency * 1000).astype(np.int64)
        self.events.add(
            key=key, pay=payment, ts=ts, endpoint=np.int8(endpoint), outcome=outcome,
            status=status, attempt=attempt, known=np.bool_(known), latency=latency,
        )  # fmt: skip
        return ts

    def transact(
        self,
        key: Ints,
        pay: Ints,
        created: Ints,
        *,
        approved: Bools,
        refund: Bools,
        reversible: bool,
        captured: Ints | None = None,
        override: bool = False,
    ) -> Bools:
        """Transaction rows and ledger entries; returns which ended approved (not reversed).
        ``captured``: an offline advice's moment of sale (not reversible here)."""
        rng, n = self.rng, len(key)
        processed = created + (rng.uniform(5, 40, n) * 1000).astype(np.int64)
        reversed_ = approved & ~refund & (rng.random(n) < 0.004) & reversible
        reversed_at = processed + (rng.uniform(20, 90, n) * SECOND).astype(np.int64)
        status = np.where(approved, np.where(reversed_, 2, 0), 1)
        self.txns.add(
            key=key, pay=pay, kind=refund.astype(np.int8), status=status.astype(np.int8),
            created=created, processed=processed, reversed_at=np.where(reversed_, reversed_at, -1),
            offline=np.bool_(captured is not None),
            captured=np.int64(-1) if captured is None else captured,
            override=np.bool_(override),
        )  # fmt: skip
        amount = self.amount[pay]
        self.entries.add(
            key=key[approved], pay=pay[approved], created=processed[approved],
            amount=np.where(refund, -amount, amount)[approved],
            kind=refund[approved].astype(np.int8),
        )  # fmt: skip
        self.emit(key[reversed_], reversed_at[reversed_], REVERSAL, OUT["reversed"], 200,
                  pay=pay[reversed_])  # fmt: skip
        self.entries.add(
            key=key[reversed_], pay=pay[reversed_], created=reversed_at[reversed_],
            amount=-amount[reversed_], kind=np.int8(2),
        )  # fmt: skip
        return approved & ~reversed_

    def _seconds(self, low: float, high: float, n: int) -> Ints:
        return (self.rng.uniform(low, high, n) * SECOND).astype(np.int64)

    # --------------------------------------------------------------- protocol
    def run(self) -> None:
        roll = self.rng.random(self.n)
        every = np.arange(self.n)
        expired = every[roll < 0.0005]
        self.emit(expired, self.start[expired], CREATE, OUT["expired"], 410, attempt=1)
        rejected = every[(roll >= 0.0005) & (roll < 0.0015)]
        self.emit(rejected, self.start[rejected], CREATE, OUT["rejected"], 422, attempt=1,
                  known=False)  # fmt: skip
        left = every[(roll >= 0.0015) & (roll < 0.0025)]
        lookup_at = self.start[left] + self._seconds(10, 30, len(left))
        self.emit(left, lookup_at, LOOKUP, OUT["not_found"], 404, known=False)
        self.emit(left, lookup_at + 30 * SECOND, ABORT, OUT["aborted"], 200, known=False)
        paying = every[roll >= 0.0025]
        offline_roll = self.rng.random(len(paying))
        sold_offline = offline_roll < self.links.loss[self.term[paying]] * OFFLINE_PER_LOSS
        self._offline(paying[sold_offline & ~self.refund[paying]])
        paying = paying[~sold_offline | self.refund[paying]]
        self._attempts(paying, slow=roll[paying] < 0.0125)

    def _offline(self, key: Ints) -> None:
        """Sold offline at ``start``, forwarded later as an advice (one create)."""
        low, high = np.log(FORWARD_DELAY_S[0]), np.log(FORWARD_DELAY_S[1])
        delay = np.exp(self.rng.uniform(low, high, len(key)))
        captured = self.start[key]
        forwarded = captured + (delay * SECOND).astype(np.int64)
        self.emit(key, forwarded, CREATE, OUT["created"], 201, attempt=1)
        purchase = np.zeros(len(key), np.bool_)
        self.transact(key, key, forwarded, approved=self.approved[key], refund=purchase,
                      reversible=False, captured=captured)  # fmt: skip
        self.offline_sales.append((key, captured, forwarded))

    def _attempts(self, key: Ints, *, slow: Bools) -> None:
        at = self.start[key].copy()
        processed = np.zeros(len(key), np.bool_)
        settled_ok = np.zeros(len(key), np.bool_)  # the transaction ended approved
        for attempt in range(1, 6):
            if not len(key):
                return
            fault = self.rng.random(len(key))
            loss = self.links.loss[self.term[key]]
            error = fault < 0.0005
            lost_request = ~error & (fault < loss / 2)
            lost_response = ~error & ~lost_request & (fault < loss)
            arrived = ~error & ~lost_request
            at[error] = self.emit(key[error], at[error], CREATE, OUT["error"], 503,
                                  attempt=attempt) + SECOND  # fmt: skip
            at[lost_request] += self._seconds(8, 15, int(lost_request.sum()))
            found = lost_request & processed
            self.emit(key[found], at[found], LOOKUP, OUT["found"], 200)
            unknown = lost_request & ~processed
            recorded = self.emit(
                key[unknown], at[unknown], LOOKUP, OUT["not_found"], 404, known=False
            )
            at[unknown] = recorded + self._seconds(0.2, 2, int(unknown.sum()))
            first = arrived & ~processed
            polling = first & slow
            outcome = np.where(first, OUT["created"], OUT["replayed"])[arrived]
            ts = np.zeros(len(key), np.int64)
            ts[arrived] = self.emit(
                key[arrived], at[arrived], CREATE, outcome, np.where(polling, 202, 201)[arrived],
                attempt=attempt, slow=polling[arrived],
            )  # fmt: skip
            settled_ok[first] = self._first_arrival(key[first], at[first], attempt)
            processed |= first
            self._poll(key[polling], ts[polling])
            answered = arrived & ~polling & ~lost_response
            self._after(key[answered], ts[answered])
            swiped = answered & settled_ok & ~self.refund[key]
            self._guard(key[swiped], ts[swiped])
            unanswered = arrived & ~polling & lost_response
            at[unanswered] = ts[unanswered] + self._seconds(8, 15, int(unanswered.sum()))
            roll = self.rng.random(len(key))
            bug = unanswered & settled_ok & ~self.refund[key] & (roll < 0.05)
            self._new_key(key[bug], at[bug])
            scenario_a = unanswered & ~bug & (self.rng.random(len(key)) < 0.5)
            self.emit(key[scenario_a], at[scenario_a], LOOKUP, OUT["found"], 200)
            going_on = error | unknown | (unanswered & ~bug & ~scenario_a)
            key, at, slow = key[going_on], at[going_on], slow[going_on]
            processed, settled_ok = processed[going_on], settled_ok[going_on]
        gave_up = ~processed  # five attempts and nothing processed: fence the key
        self.emit(key[gave_up], at[gave_up], ABORT, OUT["aborted"], 200, known=False)

    def _first_arrival(self, key: Ints, at: Ints, attempt: int) -> Bools:
        ok = self.transact(key, key, at, approved=self.approved[key], refund=self.refund[key],
                           reversible=True)  # fmt: skip
        impatient = self.rng.random(len(key)) < 0.003
        self.emit(key[impatient], at[impatient] + 5_000, CREATE, OUT["in_progress"], 409,
                  attempt=attempt + 1)  # fmt: skip
        return ok

    def _poll(self, key: Ints, ts: Ints) -> None:
        ts = self.emit(key, ts + SECOND, LOOKUP, OUT["processing"], 202)
        twice = self.rng.random(len(key)) < 0.5
        ts[twice] = self.emit(key[twice], ts[twice] + SECOND, LOOKUP, OUT["processing"], 202)
        self.emit(key, ts + SECOND, LOOKUP, OUT["found"], 200)

    def _after(self, key: Ints, ts: Ints) -> None:
        roll = self.rng.random(len(key))
        reused = roll < 0.001
        self.emit(key[reused], ts[reused] + 20 * SECOND, CREATE, OUT["key_reused"], 422, attempt=2)
        late = (roll >= 0.001) & (roll < 0.002)
        self.emit(key[late], ts[late] + 5 * SECOND, ABORT, OUT["already_processed"], 200)

    def _fresh_keys(self, n: int) -> Ints:
        new = np.arange(self.next_key, self.next_key + n, dtype=np.int64)
        self.next_key += n
        return new

    def _guard(self, original: Ints, ts: Ints) -> None:
        """A second swipe under a new key, blocked by the guard; half confirmed by the
        cashier under another key (an approved purchase with ``duplicate_override``)."""
        chosen = self.rng.random(len(original)) < GUARD_SHARE
        original, at = original[chosen], ts[chosen] + self._seconds(10, 60, int(chosen.sum()))
        blocked = self._fresh_keys(len(original))
        self.emit(blocked, at, CREATE, OUT["rejected"], 409, attempt=1, pay=original)
        self.guard_blocks.append((blocked, at))
        confirmed = self.rng.random(len(original)) < CONFIRMED_SHARE
        later = self._seconds(5, 20, int(confirmed.sum()))
        original, at = original[confirmed], at[confirmed] + later
        override = self._fresh_keys(len(original))
        self.emit(override, at, CREATE, OUT["created"], 201, attempt=1, pay=original)
        yes = np.ones(len(override), np.bool_)
        self.transact(override, original, at, approved=yes, refund=~yes, reversible=False,
                      override=True)  # fmt: skip
        self.override_keys.append((original, override, at))

    def _new_key(self, original: Ints, at: Ints) -> None:
        """The terminal lost the response and minted a new key: charged twice."""
        new = self._fresh_keys(len(original))
        self.emit(new, at, CREATE, OUT["created"], 201, attempt=1, pay=original)
        yes = np.ones(len(new), np.bool_)
        self.transact(new, original, at, approved=yes, refund=~yes, reversible=False)
        self.bug_keys.append((original, new, at))
