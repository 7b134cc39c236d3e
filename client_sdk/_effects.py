"""The sans-I/O boundary between the protocol and the clients.

The protocol (``_protocol``) is a generator that yields effects and receives their
results; ``Client`` runs them with blocking calls, ``AsyncClient`` awaits them. That is
the only difference between the two clients.

    Begin      → JournalEntry         write a new PENDING entry, leased to its driver
                                      (committed before any send)
    Claim      → JournalEntry | None  re-read an entry and take its lease (None: held)
    Release    → None                 give the lease back
    Unfinished → list[str]            the keys of every unfinished entry, oldest first
    Record     → JournalEntry         move an entry to another state
    Send       → Reply                one HTTP exchange: HttpReply, or NoReply when no
                                      answer came (whatever went wrong)
    Sleep      → None

An effect that fails (a journal error, say) is thrown into the protocol at its ``yield``:
the protocol, not the client, decides what a failure means for the payment.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from dataclasses import dataclass
from typing import Literal, TypeVar

from ._models import JournalState

__all__ = [
    "Begin",
    "Claim",
    "Effect",
    "HttpReply",
    "JournalEffect",
    "NoReply",
    "Record",
    "Release",
    "Reply",
    "Send",
    "Sleep",
    "Steps",
    "Unfinished",
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
    pass


@dataclass(frozen=True, slots=True)
class Record:
    key: str
    state: JournalState
    attempts: int | None = None
    outcome: Mapping[str, object] | None = None


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
    """No HTTP answer. ``sent=False`` only when the request certainly never left."""

    sent: bool
    error: str


JournalEffect = Begin | Claim | Release | Unfinished | Record
Effect = JournalEffect | Send | Sleep
Reply = HttpReply | NoReply
_T = TypeVar("_T")
Steps = Generator[Effect, object, _T]
