"""Store and forward (contract §4.12): the merchant's offline risk limits, and the pure
pieces of accepting a payment offline — the advice's body, the terminal's own result, the
limit a payment would break.

A payment is accepted offline only when no attempt of it may have reached the server — every
attempt failed to connect (refused, no route, DNS), never a lost answer — and the policy's
limits allow it; the journal then holds it ``STORED`` (checked and written in one journal
transaction, so two payments racing never exceed a limit together). It is forwarded later
under the same key as an advice (``"entry_mode": "offline"``, the original
``captured_at``), and never aborted: the terminal already sold.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from ._models import CardSummary, Transaction

__all__ = [
    "Limit",
    "OfflineExposure",
    "OfflinePolicy",
    "advice_body",
    "exposure",
    "offline_result",
    "refusal",
    "stamp_age",
]

Limit = Literal[
    "purchase_only", "floor_limit", "max_stored_count", "max_stored_amount", "max_age_s"
]
"""Why a payment was not accepted offline (``OfflineLimitError.limit``)."""


@dataclass(frozen=True, slots=True)
class OfflinePolicy:
    """The merchant's risk limits for selling while the server cannot be reached at all;
    pass one as ``Client(..., offline=OfflinePolicy(...))`` (off by default).

    Amounts are minor units of the payment's currency; the stored total is counted per
    currency. Raises ``ValueError`` for a negative, non-integer or non-finite limit."""

    floor_limit: int
    """The largest single payment accepted offline."""
    max_stored_count: int
    """At most this many payments stored (accepted offline, not yet forwarded) at once."""
    max_stored_amount: int
    """At most this much stored at once, per currency."""
    max_age_s: float
    """A stored payment not forwarded after this many seconds is reported (callback,
    ``recover()``), and no new payment is accepted offline until it is forwarded. Keep it
    well under the server's retention window (``GET /v1/idempotency-policy``): an advice
    older than that is refused (``advice_too_old``)."""
    connect_attempts: int = 2
    """Attempts of a payment that must all fail to connect before it is accepted offline."""

    def __post_init__(self) -> None:
        for name in ("floor_limit", "max_stored_count", "max_stored_amount"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be an integer ≥ 0: {value!r}")
        valid = isinstance(self.max_age_s, int | float) and not isinstance(self.max_age_s, bool)
        if not (valid and math.isfinite(self.max_age_s) and self.max_age_s > 0):
            raise ValueError(f"max_age_s must be a finite number > 0: {self.max_age_s!r}")
        attempts = self.connect_attempts
        if not isinstance(attempts, int) or isinstance(attempts, bool) or not 1 <= attempts <= 10:
            raise ValueError(f"connect_attempts must be an integer from 1 to 10: {attempts!r}")


@dataclass(frozen=True, slots=True)
class OfflineExposure:
    """What the terminal has sold offline and not yet forwarded (its risk counters)."""

    count: int = 0
    amounts: Mapping[str, int] = field(default_factory=dict)  # currency → minor units
    oldest_captured_at: datetime | None = None


def _captured(request: Mapping[str, Any]) -> datetime | None:
    text = request.get("captured_at")
    if not isinstance(text, str):
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def exposure(stored_requests: Iterable[Mapping[str, Any]]) -> OfflineExposure:
    """The counters of the stored payments (their journaled advices)."""
    count, amounts, oldest = 0, dict[str, int](), None
    for request in stored_requests:
        count += 1
        currency = str(request.get("currency"))
        amounts[currency] = amounts.get(currency, 0) + int(request.get("amount") or 0)
        captured = _captured(request)
        if captured is not None and (oldest is None or captured < oldest):
            oldest = captured
    return OfflineExposure(count, amounts, oldest)


def stamp_age(
    stamp: Mapping[str, Any] | None, captured_at: str | None, now: Mapping[str, Any]
) -> float | None:
    """How long ago an entry stamped ``stamp`` (with ``captured_at``) was stored, as of the
    clocks ``now`` (a stamp too: ``server_at``, ``device_at``, ``mono_at``, ``epoch``,
    ``offset_known``): the largest of what can be measured — the monotonic clock (same
    epoch only), the raw device clock (an offset learned since does not move it), and the
    corrected clock and ``captured_at`` when the offset was known at the stamp (a time
    stamped on an uncorrected clock says nothing on the server's). A time in the future
    cannot hide an entry: another measure still counts. None when nothing can be measured."""
    ages: list[float] = []
    then = stamp or {}
    known = not then or bool(then.get("offset_known"))

    def number(value: object) -> float | None:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        return float(value) if ok else None  # type: ignore[arg-type]

    pairs = [("device_at", True)]
    if then.get("epoch") == now.get("epoch"):
        pairs.append(("mono_at", True))
    pairs.append(("server_at", known))
    for name, usable in pairs:
        earlier, later = number(then.get(name)), number(now.get(name))
        if usable and earlier is not None and later is not None:
            ages.append(later - earlier)
    server_now = number(now.get("server_at"))
    if known and isinstance(captured_at, str) and server_now is not None:
        captured = datetime.fromisoformat(captured_at.replace("Z", "+00:00")).timestamp()
        ages.append(server_now - captured)
    return max(ages) if ages else None


def refusal(
    policy: OfflinePolicy,
    request: Mapping[str, Any],
    stored: OfflineExposure,
    *,
    now: float,
    oldest_age_s: float | None = None,
) -> Limit | None:
    """The limit that accepting ``request`` offline would break, or None (pure).
    ``oldest_age_s``: the age of the oldest stored entry by its stamp (``stamp_age``); when
    None, its ``captured_at`` against ``now``."""
    amount, currency = int(request.get("amount") or 0), str(request.get("currency"))
    if request.get("type", "purchase") != "purchase":
        return "purchase_only"
    if amount > policy.floor_limit:
        return "floor_limit"
    if stored.count + 1 > policy.max_stored_count:
        return "max_stored_count"
    if stored.amounts.get(currency, 0) + amount > policy.max_stored_amount:
        return "max_stored_amount"
    if oldest_age_s is not None:
        if oldest_age_s > policy.max_age_s:
            return "max_age_s"
        return None
    oldest = stored.oldest_captured_at
    if oldest is not None and now - oldest.timestamp() > policy.max_age_s:
        return "max_age_s"
    return None


def advice_body(request_json: str) -> str:
    """The journaled request as an advice: ``entry_mode: offline``, its original
    ``captured_at`` kept, ``expires_at`` dropped (an advice is exempt from it)."""
    body: dict[str, Any] = json.loads(request_json)
    body.pop("expires_at", None)
    body["entry_mode"] = "offline"
    return json.dumps(body, separators=(",", ":"), sort_keys=True)


def offline_result(key: str, advice_json: str) -> Transaction:
    """The terminal's own answer for a payment it accepted offline: approved by the
    terminal, ``offline=True``; the server's answer comes when it is forwarded."""
    body: dict[str, Any] = json.loads(advice_json)
    card = body.get("card") or {}
    return Transaction(
        id=key,
        status="approved",
        decline_reason=None,
        authorization_code=None,
        terminal_id=str(body.get("terminal_id")),
        type=str(body.get("type", "purchase")),
        amount=int(body["amount"]),
        currency=str(body["currency"]),
        card=CardSummary(last4=str(card.get("last4")), brand=str(card.get("brand"))),
        installments=body.get("installments", 1),
        created_at=None,
        processed_at=None,
        reversed_at=None,
        offline=True,
    )
