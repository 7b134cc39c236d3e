"""Typed, frozen results: plain stdlib dataclasses built from the API's JSON bodies."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Literal, cast

from ._exceptions import IdempayError

__all__ = [
    "Card",
    "CardSummary",
    "Fenced",
    "JournalState",
    "Processing",
    "Recovered",
    "Transaction",
    "TransactionStatus",
    "card_from",
]

TransactionStatus = Literal["approved", "declined", "reversed"]
"""A processed transaction's ``status``."""
_STATUSES: frozenset[str] = frozenset({"approved", "declined", "reversed"})


class JournalState(StrEnum):
    """Where a payment stands in the terminal's journal (RESOLVED, ABORTED and REPORTED
    are final).

    STORED: accepted offline under the terminal's ``OfflinePolicy`` — sold, and owed to the
    server, which has not processed it yet; forwarded (same key) as an advice. REPORTED: a
    stored payment the server refused for good (``advice_too_old``, or its key fenced):
    never processed, kept for the merchant to reconcile."""

    PENDING = "PENDING"
    SENT = "SENT"
    IN_DOUBT = "IN_DOUBT"
    STORED = "STORED"
    RESOLVED = "RESOLVED"
    ABORTED = "ABORTED"
    REPORTED = "REPORTED"

    @property
    def is_terminal(self) -> bool:
        """True for RESOLVED, ABORTED and REPORTED: the entry is final."""
        return self in (JournalState.RESOLVED, JournalState.ABORTED, JournalState.REPORTED)


@dataclass(frozen=True, slots=True)
class Card:
    """A tokenized card as the terminal sends it (never a PAN)."""

    token: str
    last4: str
    brand: str

    def to_json(self) -> dict[str, str]:
        """The ``card`` object of the create request."""
        return {"token": self.token, "last4": self.last4, "brand": self.brand}


@dataclass(frozen=True, slots=True)
class CardSummary:
    """The card as the server echoes it back."""

    last4: str
    brand: str


def card_from(card: Card | Mapping[str, str]) -> Card:
    """Accept a ``Card`` or a ``{"token", "last4", "brand"}`` mapping."""
    if isinstance(card, Card):
        return card
    missing = {"token", "last4", "brand"} - set(card)
    if missing:
        raise ValueError(f"card is missing {sorted(missing)}")
    return Card(token=str(card["token"]), last4=str(card["last4"]), brand=str(card["brand"]))


def _str(body: Mapping[str, object], name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str):
        raise ValueError(f"transaction body: {name!r} is not a string")
    return value


def _opt_str(body: Mapping[str, object], name: str) -> str | None:
    value = body.get(name)
    return None if value is None else _str(body, name)


def _opt_time(body: Mapping[str, object], name: str) -> datetime | None:
    value = _opt_str(body, name)
    return None if value is None else datetime.fromisoformat(value)


def _int(body: Mapping[str, object], name: str) -> int:
    value = body.get(name)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"transaction body: {name!r} is not an integer")
    return value


@dataclass(frozen=True, slots=True)
class Transaction:
    """A processed transaction, as the server returned it; ``id`` is its idempotency key.

    ``status`` is ``"approved"`` (``authorization_code`` set), ``"declined"``
    (``decline_reason`` set) or ``"reversed"`` (``reversed_at`` set); ``amount`` is in
    minor units of ``currency``; ``type`` is ``"purchase"`` or ``"refund"``.

    ``offline`` is True for a payment accepted offline: either the SDK's own result when it
    stored the payment (``status`` ``"approved"`` by the terminal, no
    ``authorization_code``, no server times yet), or the server's transaction for the
    forwarded advice (approved or declined)."""

    id: str
    status: TransactionStatus
    decline_reason: str | None
    authorization_code: str | None
    terminal_id: str
    type: str
    amount: int
    currency: str
    card: CardSummary
    installments: int | None
    created_at: datetime | None
    processed_at: datetime | None
    reversed_at: datetime | None
    offline: bool = False

    @property
    def approved(self) -> bool:
        """True when ``status`` is ``"approved"``."""
        return self.status == "approved"

    @classmethod
    def from_json(cls, body: object) -> Transaction:
        """Parse a transaction body; ValueError if it is not one."""
        if not isinstance(body, Mapping):
            raise ValueError("transaction body is not an object")
        status = _str(body, "status")
        if status not in _STATUSES:
            raise ValueError(f"not a transaction status: {status!r}")
        card = body.get("card")
        if not isinstance(card, Mapping):
            raise ValueError("transaction body: 'card' is not an object")
        installments = body.get("installments")
        return cls(
            id=_str(body, "id"),
            status=cast(TransactionStatus, status),
            decline_reason=_opt_str(body, "decline_reason"),
            authorization_code=_opt_str(body, "authorization_code"),
            terminal_id=_str(body, "terminal_id"),
            type=_str(body, "type"),
            amount=_int(body, "amount"),
            currency=_str(body, "currency"),
            card=CardSummary(last4=_str(card, "last4"), brand=_str(card, "brand")),
            installments=None if installments is None else _int(body, "installments"),
            created_at=_opt_time(body, "created_at"),
            processed_at=_opt_time(body, "processed_at"),
            reversed_at=_opt_time(body, "reversed_at"),
            offline=body.get("offline") is True,
        )


@dataclass(frozen=True, slots=True)
class Processing:
    """A lookup answered 202: the server is still working on the key."""

    id: str
    retry_after: float | None


@dataclass(frozen=True, slots=True)
class Fenced:
    """An abort answered: the key is fenced (aborted or expired), nothing was processed."""

    id: str
    status: Literal["aborted", "expired"]


@dataclass(frozen=True, slots=True)
class Recovered:
    """What ``recover()`` did with one journal entry: the ``state`` it ended in
    (RESOLVED, ABORTED, or still IN_DOUBT), the ``transaction`` when the server processed
    it, and the ``error`` that explains any other ending — a ``PaymentAbortedError`` for a
    fenced key, the server's rejection, or what kept it in doubt (None when it settled
    with a transaction)."""

    key: str
    state: JournalState
    transaction: Transaction | None
    error: IdempayError | None
