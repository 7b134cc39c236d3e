"""The acquirer link's public surface: what the create pipeline asks and what it is told.

Exception tree (a caller handles exactly these)::

    AcquirerError
    ├── NeverSent        provably nothing left: no connection, or refused before any
    │                    byte of the 0200 was written — the key may be released (503)
    └── InDoubt          the 0200 (or 0400) may have reached the acquirer and no answer
                         came in time, or its connection broke after the first byte:
                         never resend; settle declined / acquirer_timeout + queue a 0420

The link never resends a 0200; that rule lives here, not in the callers.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


class AcquirerError(Exception):
    """Base of every link failure the pipeline handles."""


class NeverSent(AcquirerError):
    """Nothing of the message was written to any socket: no authorization can exist."""


class InDoubt(AcquirerError):
    """The message may have reached the acquirer; its outcome is unknown. ``stan`` and
    ``transmitted_at``: the message's fields 11 and 7, for the reversal advice's field 90."""

    def __init__(
        self, why: str, *, stan: str | None = None, transmitted_at: datetime | None = None
    ) -> None:
        super().__init__(why)
        self.stan = stan
        self.transmitted_at = transmitted_at


@dataclass(frozen=True, slots=True)
class AuthorizationRequest:
    """One 0200. ``rrn`` is derived from (merchant, key) and stable across restarts."""

    rrn: str  # field 37, 12 characters
    merchant_id: str  # idempay's merchant id (field 48 private data; field 42 derived)
    terminal_id: str  # field 41 (8 chars, derived) and field 48 (idempay's own id)
    card_token: str  # field 48, never a PAN
    amount: int  # minor units, field 4
    currency: str  # ISO 4217 alpha, sent as numeric in field 49
    type: str  # "purchase" (processing code 000000) | "refund" (200000)
    captured_at: datetime | None  # fields 12/13 (terminal local time/date)


@dataclass(frozen=True, slots=True)
class Authorization:
    """The 0210: approved when field 39 is ``00``."""

    approved: bool
    authorization_code: str | None  # field 38
    decline_reason: str | None  # from field 39 (docs/contract.md, "Response codes")
    response_code: str  # field 39 as received
    stan: str  # field 11 the request went with


@dataclass(frozen=True, slots=True)
class ReversalRequest:
    """A 0400 (reversal request) or 0420/0421 (reversal advice) for an earlier 0200:
    same RRN; field 90 carries the original's MTI, STAN and transmission time."""

    rrn: str
    merchant_id: str
    terminal_id: str
    amount: int
    currency: str
    type: str
    original_stan: str  # the 0200's field 11 ("000000" when unknown)
    original_transmitted_at: datetime | None  # the 0200's field 7
    repeat: bool = False  # 0421 instead of 0420 (advices only)
