"""The sans-I/O boundary between the protocol and the clients.

The protocol (``_protocol``) is a generator that yields effects and receives their
results; ``Client`` runs them with blocking calls, ``AsyncClient`` awaits them. That is
the only difference between the two clients.

    Begin  → JournalEntry   write a new PENDING entry (committed before any send)
    Record → JournalEntry   move an entry to another state
    Send   → Reply          one HTTP exchange: HttpReply, or NoReply on a network failure
    Sleep  → None
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from dataclasses import dataclass
from typing import Literal, TypeVar

from ._models import JournalState

__all__ = [
    "Begin",
    "Effect",
    "HttpReply",
    "NoReply",
    "Record",
    "Reply",
    "Send",
    "Sleep",
    "Steps",
]


@dataclass(frozen=True, slots=True)
class Begin:
    key: str
    request_json: str
    deadline: float
    reverse_late_approval: bool


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


Effect = Begin | Record | Send | Sleep
Reply = HttpReply | NoReply
_T = TypeVar("_T")
Steps = Generator[Effect, object, _T]
