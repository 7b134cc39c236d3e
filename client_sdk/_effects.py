"""The sans-I/O boundary between the protocol and the clients.

The protocol (``_protocol``) is a generator that yields effects and receives their
results; ``Client`` runs them with blocking calls, ``AsyncClient`` awaits them. That is
the only difference between the two clients.

    Begin      → JournalEntry         write a new PENDING entry, leased to its driver
                                      (committed before any send)
    Claim      → JournalEntry | None  re-read an entry and take its lease (None: held)
    Release    → None                 give the lease back
    Unfinished → list[str]            the keys of every unfinished entry (or of every
                                      STORED one), oldest first
    Record     → JournalEntry         move an entry to another state
    Store      → JournalEntry | Limit accept a payment offline (STORED), or the limit of
                                      the offline policy it would break (nothing written)
    Peek       → JournalEntry | None  read an entry (no lease)
    Send       → Reply                one HTTP exchange: HttpReply, or NoReply when no
                                      answer came (whatever went wrong)
    Sleep      → None
    Notify     → None                 tell the application (``on_offline_decline``,
                                      ``on_offline_error``); its failure is ignored

An effect that fails (a journal error, say) is thrown into the protocol at its ``yield``:
the protocol, not the client, decides what a failure means for the payment.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar, cast

from ._models import JournalState
from ._offline import OfflinePolicy

__all__ = [
    "Begin",
    "Claim",
    "Done",
    "Effect",
    "HttpReply",
    "JournalEffect",
    "NoReply",
    "Notify",
    "Peek",
    "Record",
    "Release",
    "Reply",
    "Send",
    "Sleep",
    "Steps",
    "Store",
    "Unfinished",
    "advance",
]


@dataclass(frozen=True, slots=True)
class Begin:
    key: str
    request_json: str
    deadline: float  # wall clock (unix seconds): it must survive a reboot
    reverse_late_approval: bool
    owner: str
    lease_until: float


@dataclass(frozen=True, slots=True)
class Claim:
    key: str
    owner: str
    now: float
    hold_s: float


@dataclass(frozen=True, slots=True)
class Release:
    key: str
    owner: str


@dataclass(frozen=True, slots=True)
class Unfinished:
    stored_only: bool = False


@dataclass(frozen=True, slots=True)
class Store:
    key: str
    advice_json: str
    policy: OfflinePolicy
    now: float  # the server's time as best known (unix seconds)
    stamp: Mapping[str, object] | None = None  # the clocks when it was stored (_forward)


@dataclass(frozen=True, slots=True)
class Peek:
    key: str


@dataclass(frozen=True, slots=True)
class Notify:
    """``kind`` ``offline_decline``: ``payload`` is the declined ``Transaction``;
    ``offline_error``: an ``IdempayError`` about a stored payment (``AdviceTooOldError``,
    ``StoredPaymentOverdueError``, ``PaymentAbortedError`` for a fenced key)."""

    kind: Literal["offline_decline", "offline_error"]
    payload: object


@dataclass(frozen=True, slots=True)
class Record:
    key: str
    state: JournalState
    attempts: int | None = None
    outcome: Mapping[str, object] | None = None
    request_json: str | None = None  # a STORED advice re-stamped (only while still STORED)


@dataclass(frozen=True, slots=True)
class Send:
    method: Literal["GET", "POST"]
    path: str
    headers: Mapping[str, str]
    content: str | None
    timeout: float


@dataclass(frozen=True, slots=True)
class Sleep:
    seconds: float


@dataclass(frozen=True, slots=True)
class HttpReply:
    """An HTTP answer; header names are lower-case, ``body`` is parsed JSON or None."""

    status: int
    headers: Mapping[str, str]
    body: object


@dataclass(frozen=True, slots=True)
class NoReply:
    """No HTTP answer. ``sent=False`` only when the request certainly never left;
    ``link_down`` only when no connection to the server could be made at all (refused, no
    route, DNS failure, connect timeout) — what may turn a payment into an offline sale."""

    sent: bool
    error: str
    link_down: bool = False


JournalEffect = Begin | Claim | Release | Unfinished | Record | Store | Peek
Effect = JournalEffect | Send | Sleep | Notify
Reply = HttpReply | NoReply
_T = TypeVar("_T")
Steps = Generator[Effect, object, _T]


@dataclass(frozen=True, slots=True)
class Done(Generic[_T]):
    """The steps returned ``value``: nothing more to run."""

    value: _T


def advance(steps: Steps[_T], reply: object, failure: Exception | None) -> Effect | Done[_T]:
    """Give the protocol the last effect's result (or throw its failure in): its next
    effect, or ``Done`` — the one step both clients' interpreters share."""
    try:
        return steps.send(reply) if failure is None else steps.throw(failure)
    except StopIteration as done:
        return Done(cast(_T, done.value))
