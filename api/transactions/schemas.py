"""Request and response bodies of ``/v1/transactions`` (contract §2).

The create body's bounds, patterns and choices come from ``sale_rules`` (generated from the
terminal SDK's ``client_sdk/_sale_rules.py``, the one table both sides are built from: the
SDK refuses offline exactly what this schema refuses online)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    StrictBool,
    StrictStr,
    WithJsonSchema,
    field_validator,
    model_serializer,
    model_validator,
)

from api.sale_rules import CREATE_BODY, METADATA_MAX_BYTES, METADATA_MAX_DEPTH

_RULES: dict[str, Any] = CREATE_BODY["properties"]
_CARD_RULES: dict[str, Any] = _RULES["card"]["properties"]


def _depth(value: Any) -> int:
    """Nesting depth of a decoded JSON value (a scalar is 0), without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict | list):
            level += 1
            deepest = max(deepest, level)
            stack.extend(
                (child, level) for child in (item.values() if isinstance(item, dict) else item)
            )
    return deepest


def _whole_number(value: Any) -> Any:
    """JSON Schema's ``integer``: 1250 and 1250.0 are the same number; 12.5, "1250" and true
    are not integers. The value is normalized to an int before it is fingerprinted."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError("must be an integer")
    return value


def _timestamp_text(value: Any) -> Any:
    """A timestamp is an RFC 3339 string, as the OpenAPI document says: a number (which
    pydantic would read as Unix seconds) is refused, not guessed at."""
    if value is not None and not isinstance(value, str):
        raise ValueError("must be an RFC 3339 date-time string")
    return value


def _in_utc_range(value: datetime) -> datetime:
    """A timestamp must have a UTC instant: ``0001-01-01T00:00:00+14:00`` and
    ``9999-12-31T23:59:59-14:00`` are valid RFC 3339 but fall outside the years 1–9999 once
    in UTC, where every comparison and column is (a 500 before the review, finding B)."""
    try:
        value.astimezone(UTC)
    except OverflowError:
        raise ValueError("out of range: not an instant between years 1 and 9999 in UTC") from None
    return value


Timestamp = Annotated[
    AwareDatetime, BeforeValidator(_timestamp_text), AfterValidator(_in_utc_range)
]


def _integer(minimum: int, maximum: int) -> WithJsonSchema:
    return WithJsonSchema({"type": "integer", "minimum": minimum, "maximum": maximum})


def _choices(name: str, literal: Any) -> None:
    """A ``Literal`` spelled here (for the type checker) is exactly the rule's ``enum``."""
    if list(get_args(literal)) != _RULES[name]["enum"]:
        raise AssertionError(f"{name}: {get_args(literal)} is not the rule's {_RULES[name]}")


TransactionType = Literal["purchase", "refund"]
EntryMode = Literal["online", "offline"]
_choices("type", TransactionType)
_choices("entry_mode", EntryMode)

TerminalId = Annotated[
    StrictStr, Field(pattern=_RULES["terminal_id"]["pattern"], examples=["T-0001"])
]
_AMOUNT, _INSTALLMENTS = _RULES["amount"], _RULES["installments"]
Amount = Annotated[
    int,
    BeforeValidator(_whole_number),
    Field(ge=_AMOUNT["minimum"], le=_AMOUNT["maximum"]),
    _integer(_AMOUNT["minimum"], _AMOUNT["maximum"]),
]
Installments = Annotated[
    int,
    BeforeValidator(_whole_number),
    Field(ge=_INSTALLMENTS["minimum"], le=_INSTALLMENTS["maximum"]),
    _integer(_INSTALLMENTS["minimum"], _INSTALLMENTS["maximum"]),
]


class CardIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    token: Annotated[StrictStr, Field(pattern=_CARD_RULES["token"]["pattern"])]
    last4: Annotated[StrictStr, Field(pattern=_CARD_RULES["last4"]["pattern"])]
    brand: Annotated[StrictStr, Field(pattern=_CARD_RULES["brand"]["pattern"])]


class TransactionCreate(BaseModel):
    """The create body. Unknown fields are rejected; money is integer minor units."""

    model_config = ConfigDict(extra="forbid")

    terminal_id: TerminalId
    type: TransactionType = _RULES["type"]["default"]
    amount: Amount
    currency: Annotated[StrictStr, Field(pattern=_RULES["currency"]["pattern"], examples=["BRL"])]
    card: CardIn
    installments: Installments = _INSTALLMENTS["default"]
    captured_at: Timestamp | None = None
    expires_at: Timestamp | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    entry_mode: EntryMode = Field(
        default=_RULES["entry_mode"]["default"],
        description="offline: an advice — a payment the terminal accepted offline, forwarded "
        "later with its original captured_at (required); exempt from expires_at, not from "
        "the retention window (422 advice_too_old).",
    )
    allow_duplicate: StrictBool = Field(
        default=False,
        description="The cashier confirmed a sale the merchant's duplicate guard answered "
        "409 suspected_duplicate: process it. The cashier's instruction, not the payment: "
        "left out of the idempotency fingerprint, never stored in metadata nor echoed.",
    )

    @model_validator(mode="after")
    def _advice_has_its_capture_time(self) -> TransactionCreate:
        if self.entry_mode == "offline" and self.captured_at is None:
            raise ValueError("an offline advice carries its original captured_at")
        return self

    @model_serializer(mode="wrap")
    def _canonical(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """The canonical body (fingerprint, stored request): ``entry_mode`` is part of it
        when it is ``offline``; the default ``online`` is left out, so every fingerprint
        taken before the field existed is unchanged."""
        data: dict[str, Any] = handler(self)
        if data.get("entry_mode") == "online":
            del data["entry_mode"]
        data.pop("allow_duplicate", None)  # the cashier's instruction, not the payment
        return data

    def stored_request(self) -> str:
        """The request stored with a claimed key (what recovery re-drives): the canonical
        body, plus ``"allow_duplicate": true`` when the guard found a suspect and the cashier
        overrode it (``TransactionService`` sets the field to mean exactly that before it
        stores), so the completer records the override too."""
        text = self.model_dump_json()
        if not self.allow_duplicate:
            return text
        data = json.loads(text)
        data["allow_duplicate"] = True
        return json.dumps(data, separators=(",", ":"), ensure_ascii=False)

    @property
    def is_advice(self) -> bool:
        """An offline advice (contract §2.2)."""
        return self.entry_mode == "offline"

    @field_validator("metadata")
    @classmethod
    def _metadata_small(cls, value: dict[str, Any]) -> dict[str, Any]:
        # Depth first: serializing (here, for the fingerprint, for storage) a deep structure
        # hits the serializer's recursion limit, a 500 instead of this 422.
        depth = _depth(value)
        if depth > METADATA_MAX_DEPTH:
            raise ValueError(
                f"metadata is nested {depth} levels deep; the limit is {METADATA_MAX_DEPTH}"
            )
        size = len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())
        if size > METADATA_MAX_BYTES:
            raise ValueError(
                f"metadata is {size} bytes serialized; the limit is {METADATA_MAX_BYTES}"
            )
        return value


class CardOut(BaseModel):
    last4: str
    brand: str


class TransactionOut(BaseModel):
    id: str
    status: Literal["approved", "declined", "reversed"]
    decline_reason: str | None
    authorization_code: str | None
    terminal_id: str
    type: Literal["purchase", "refund"]
    amount: int
    currency: str
    card: CardOut
    installments: int
    created_at: datetime
    processed_at: datetime
    reversed_at: datetime | None
    offline: bool = Field(description="an offline advice: sold offline, forwarded later")


class KeyStateOut(BaseModel):
    """Body of 202 (processing) and of an abort that fenced the key."""

    id: str
    status: Literal["processing", "aborted", "expired"]


class Problem(BaseModel):
    type: str
    title: str
    status: int
    detail: str
    code: str
    errors: list[dict[str, Any]] | None = None
    duplicate_of: str | None = Field(
        default=None,
        description="409 suspected_duplicate only: the id of the earlier approved purchase",
    )
