"""Build and read the messages of :mod:`api.acquirer.spec` — both sides of the link.

The server builds requests (:func:`financial_request`, :func:`reversal_request`,
:func:`reversal_advice`, :func:`network_request`) and reads answers (:func:`parse_answer`);
the acquirer host reads requests (:func:`parse_request`) and builds answers
(:func:`answer`). Anything that does not decode into a message of the spec, or lacks a
field its type requires, is a :class:`MessageError` — garbage, never a message.

Private data (field 48) is ``M=<merchant>;T=<terminal>;K=<token>``: three ``tag=value``
elements separated by ``;``, in that order when written, read in any order; each value is
percent-encoded (UTF-8) except for ``[A-Za-z0-9_.-]``, so ``;``, ``=`` and ``%`` inside an
id never split it. Unknown tags are ignored when read (room to add), a repeated or missing
tag is an error, and the whole element is at most 999 characters.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from base64 import b32encode
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from urllib.parse import quote, unquote

import iso8583

from api.acquirer.spec import SPEC, UnsupportedCurrency, currency_alpha, currency_numeric
from api.acquirer.types import Authorization, AuthorizationRequest, ReversalRequest

__all__ = [
    "ANSWER_MTI",
    "ECHO",
    "RESPONSE_CODES",
    "SIGN_OFF",
    "SIGN_ON",
    "Answer",
    "MessageError",
    "Request",
    "answer",
    "authorization_from",
    "decline_reason_for",
    "financial_request",
    "merchant_field",
    "network_request",
    "parse_answer",
    "parse_private_data",
    "parse_request",
    "financial_advice",
    "private_data",
    "reversal_advice",
    "reversal_request",
    "rrn_for",
    "terminal_field",
    "transmission_time",
]

ANSWER_MTI = {
    "0200": "0210",
    "0220": "0230",
    "0221": "0230",
    "0400": "0410",
    "0420": "0430",
    "0421": "0430",
    "0800": "0810",
}
# Authorizations: the 0200 request, and the 0220/0221 advice of a sale the terminal made
# offline (store and forward: repeatable, applied once per RRN; never counted as a 0200).
FINANCIAL_MTIS = frozenset({"0200", "0220", "0221"})
SIGN_ON, SIGN_OFF, ECHO = "001", "002", "301"
PROCESSING_CODE = {"purchase": "000000", "refund": "200000"}
PROCESSING_TYPE = {code: kind for kind, code in PROCESSING_CODE.items()}

RESPONSE_CODES: dict[str, str] = {
    "01": "refer_to_issuer",
    "03": "invalid_merchant",
    "04": "pick_up_card",
    "05": "do_not_honor",
    "12": "invalid_transaction",
    "13": "invalid_amount",
    "14": "invalid_card",
    "30": "format_error",
    "41": "lost_card",
    "43": "stolen_card",
    "51": "insufficient_funds",
    "54": "expired_card",
    "57": "not_permitted_to_cardholder",
    "58": "not_permitted_to_terminal",
    "61": "exceeds_amount_limit",
    "62": "restricted_card",
    "65": "exceeds_frequency_limit",
    "91": "issuer_unavailable",
    "94": "duplicate_transmission",
    "96": "system_malfunction",
}
"""Field 39 → ``decline_reason`` (``00`` approves; any code not listed: ``response_code_XX``)."""

_ZERO_TIME = "0000000000"
_INSTITUTIONS = "0" * 22  # field 90: acquiring + forwarding institution ids (unused, zeros)
_SAFE = re.compile(r"[A-Za-z0-9_.\-]*")
_RRN_ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_RRN_SPACE = 36**12


class MessageError(ValueError):
    """Bytes that are not a message of the spec, or a message missing a required field."""


def rrn_for(secret: bytes, merchant_id: str, key: str) -> str:
    """Field 37 for (merchant, idempotency key): 12 of ``[0-9A-Z]``, the same on every
    process and restart sharing ``secret``; unguessable without it. The space is 36¹²
    (≈ 4.7·10¹⁸ ≈ 2⁶²): among 10⁸ keys the chance of any two sharing an RRN is ≈ 0.1 %."""
    message = f"{len(merchant_id)}:{merchant_id}{key.lower()}".encode()
    number = int.from_bytes(hmac.digest(secret, message, "sha256")[:12], "big") % _RRN_SPACE
    digits = []
    for _ in range(12):
        number, digit = divmod(number, 36)
        digits.append(_RRN_ALPHABET[digit])
    return "".join(reversed(digits))


@lru_cache(maxsize=4096)
def terminal_field(terminal_id: str) -> str:
    """Field 41: 8 characters ``[A-Z2-7]`` hashed from idempay's terminal id."""
    return b32encode(hashlib.sha256(terminal_id.encode()).digest()).decode()[:8]


@lru_cache(maxsize=4096)
def merchant_field(merchant_id: str) -> str:
    """Field 42: 15 characters ``[A-Z2-7]`` hashed from idempay's merchant id."""
    return b32encode(hashlib.sha256(merchant_id.encode()).digest()).decode()[:15]


def _escape(value: str) -> str:
    return value if _SAFE.fullmatch(value) else quote(value, safe="")


def private_data(merchant_id: str, terminal_id: str, card_token: str) -> str:
    """Field 48 (module docstring)."""
    text = f"M={_escape(merchant_id)};T={_escape(terminal_id)};K={_escape(card_token)}"
    if len(text) > 999:
        raise MessageError("private data (field 48) longer than 999 characters")
    return text


def parse_private_data(text: str) -> tuple[str, str, str]:
    """(merchant id, terminal id, card token) from field 48."""
    found: dict[str, str] = {}
    for element in text.split(";"):
        tag, sep, value = element.partition("=")
        if not sep:
            raise MessageError(f"private data element without '=': {element[:20]!r}")
        if tag in found:
            raise MessageError(f"private data tag {tag!r} repeated")
        found[tag] = unquote(value, errors="strict")
    try:
        return found["M"], found["T"], found["K"]
    except KeyError as exc:
        raise MessageError(f"private data lacks tag {exc.args[0]}") from None


def transmission_time(at: datetime) -> str:
    """Field 7 (``MMDDhhmmss``, UTC) for an aware datetime."""
    return at.astimezone(UTC).strftime("%m%d%H%M%S")


def _time_from(text: str, *, now: datetime) -> datetime | None:
    """Field 7 back to a datetime: the year that puts it nearest ``now`` (None for zeros)."""
    if text == _ZERO_TIME:
        return None
    try:
        candidates = [
            datetime.strptime(f"{year}{text}", "%Y%m%d%H%M%S").replace(tzinfo=UTC)
            for year in (now.year - 1, now.year, now.year + 1)
            if not (text.startswith("0229") and year % 4)
        ]
    except ValueError:
        raise MessageError(f"transmission time {text!r} is not MMDDhhmmss") from None
    return min(candidates, key=lambda c: abs(c - now)) if candidates else None


def _amount(amount: int) -> str:
    if not 0 <= amount < 10**12:
        raise MessageError(f"amount {amount} does not fit field 4 (n12)")
    return f"{amount:012d}"


def _encode(doc: dict[str, str]) -> bytes:
    try:
        return bytes(iso8583.encode(doc, SPEC)[0])
    except iso8583.EncodeError as exc:
        raise MessageError(str(exc)) from None


def financial_request(
    req: AuthorizationRequest, *, stan: str, transmitted_at: datetime, mti: str = "0200"
) -> bytes:
    """The 0200 for ``req``, sent with ``stan`` at ``transmitted_at`` (or, with ``mti``, the
    same fields as a 0220/0221 advice: :func:`financial_advice`)."""
    doc = {
        "t": mti,
        "3": PROCESSING_CODE[req.type],
        "4": _amount(req.amount),
        "7": transmission_time(transmitted_at),
        "11": stan,
        "37": req.rrn,
        "41": terminal_field(req.terminal_id),
        "42": merchant_field(req.merchant_id),
        "48": private_data(req.merchant_id, req.terminal_id, req.card_token),
        "49": currency_numeric(req.currency),
    }
    if req.captured_at is not None:
        doc["12"] = req.captured_at.strftime("%H%M%S")
        doc["13"] = req.captured_at.strftime("%m%d")
    return _encode(doc)


def financial_advice(
    req: AuthorizationRequest, *, stan: str, transmitted_at: datetime, repeat: bool
) -> bytes:
    """The 0220 for an offline sale — 0221 when ``repeat`` — with a 0200's fields."""
    mti = "0221" if repeat else "0220"
    return financial_request(req, stan=stan, transmitted_at=transmitted_at, mti=mti)


def _reversal(mti: str, req: ReversalRequest, stan: str, transmitted_at: datetime) -> bytes:
    original = req.original_transmitted_at
    return _encode(
        {
            "t": mti,
            "3": PROCESSING_CODE[req.type],
            "4": _amount(req.amount),
            "7": transmission_time(transmitted_at),
            "11": stan,
            "37": req.rrn,
            "41": terminal_field(req.terminal_id),
            "42": merchant_field(req.merchant_id),
            "48": private_data(req.merchant_id, req.terminal_id, ""),
            "49": currency_numeric(req.currency),
            "90": "0200"
            + req.original_stan
            + (_ZERO_TIME if original is None else transmission_time(original))
            + _INSTITUTIONS,
        }
    )


def reversal_request(req: ReversalRequest, *, stan: str, transmitted_at: datetime) -> bytes:
    """The 0400 for ``req`` (field 90: the original 0200's data elements)."""
    return _reversal("0400", req, stan, transmitted_at)


def reversal_advice(req: ReversalRequest, *, stan: str, transmitted_at: datetime) -> bytes:
    """The 0420 for ``req`` — 0421 when ``req.repeat``."""
    return _reversal("0421" if req.repeat else "0420", req, stan, transmitted_at)


def network_request(code: str, *, stan: str, transmitted_at: datetime) -> bytes:
    """A 0800 with network management code ``code`` (:data:`SIGN_ON`, :data:`ECHO`, …)."""
    return _encode({"t": "0800", "7": transmission_time(transmitted_at), "11": stan, "70": code})


def decode(payload: bytes) -> dict[str, str]:
    """The fields of one message; :class:`MessageError` when it is not one of the spec's."""
    try:
        doc, _ = iso8583.decode(payload, SPEC)
    except (iso8583.DecodeError, KeyError, ValueError, IndexError):
        raise MessageError("frame does not decode as an ISO 8583 message of the spec") from None
    return doc


def _need(doc: dict[str, str], *fields: str) -> None:
    missing = [f for f in fields if f not in doc]
    if missing:
        raise MessageError(f"{doc['t']} lacks field(s) {', '.join(missing)}")
    if not doc["11"].isascii() or not doc["11"].isdigit():
        raise MessageError(f"STAN {doc['11']!r} is not numeric")


@dataclass(frozen=True, slots=True)
class Answer:
    """An answer read by the link: matched to its request by (STAN, RRN)."""

    mti: str  # 0210 / 0410 / 0430 / 0810
    stan: str
    rrn: str  # "" for a 0810
    response_code: str
    authorization_code: str | None


def parse_answer(payload: bytes) -> Answer:
    """One answer from the acquirer; any other message is a :class:`MessageError`."""
    doc = decode(payload)
    mti = doc["t"]
    if mti not in ("0210", "0230", "0410", "0430", "0810"):
        raise MessageError(f"MTI {mti!r} is not an answer")
    _need(doc, "11", "39", *(() if mti == "0810" else ("37",)))
    return Answer(mti, doc["11"], doc.get("37", ""), doc["39"], doc.get("38"))


def decline_reason_for(response_code: str) -> str | None:
    """``decline_reason`` for field 39: None when approved (``00``)."""
    if response_code == "00":
        return None
    return RESPONSE_CODES.get(response_code, f"response_code_{response_code}")


def authorization_from(ans: Answer) -> Authorization:
    """The pipeline's view of a 0210."""
    approved = ans.response_code == "00"
    return Authorization(
        approved=approved,
        authorization_code=ans.authorization_code if approved else None,
        decline_reason=decline_reason_for(ans.response_code),
        response_code=ans.response_code,
        stan=ans.stan,
    )


@dataclass(frozen=True, slots=True)
class Request:
    """A request read by the acquirer host. ``fields`` is the decoded message (for
    :func:`answer`); exactly one of the three views is set, by MTI."""

    mti: str
    stan: str
    transmitted_at: datetime | None
    fields: dict[str, str]
    authorization: AuthorizationRequest | None = None  # 0200 / 0220 / 0221
    reversal: ReversalRequest | None = None  # 0400 / 0420 / 0421
    network_code: str | None = None  # 0800


def parse_request(payload: bytes, *, now: datetime | None = None) -> Request:
    """One request from the link; field 7's year is the one nearest ``now`` (default: now)."""
    now = now or datetime.now(UTC)
    doc = decode(payload)
    mti = doc["t"]
    if mti not in ANSWER_MTI:
        raise MessageError(f"MTI {mti!r} is not a request")
    if mti == "0800":
        _need(doc, "7", "11", "70")
        return Request(mti, doc["11"], _time_from(doc["7"], now=now), doc, network_code=doc["70"])
    _need(doc, "3", "4", "7", "11", "37", "48", "49", *(() if mti in FINANCIAL_MTIS else ("90",)))
    merchant, terminal, token = parse_private_data(doc["48"])
    kind = PROCESSING_TYPE.get(doc["3"])
    if kind is None or not doc["4"].isdigit():
        raise MessageError(f"processing code {doc['3']!r} or amount {doc['4']!r} invalid")
    try:
        currency = currency_alpha(doc["49"])
    except UnsupportedCurrency as exc:
        raise MessageError(str(exc)) from None
    sent = _time_from(doc["7"], now=now)
    common = {"rrn": doc["37"], "merchant_id": merchant, "terminal_id": terminal}
    if mti in FINANCIAL_MTIS:
        auth = AuthorizationRequest(
            **common, card_token=token, amount=int(doc["4"]), currency=currency, type=kind,
            captured_at=_captured_at(doc, sent),
        )  # fmt: skip
        return Request(mti, doc["11"], sent, doc, authorization=auth)
    original = doc["90"]
    reversal = ReversalRequest(
        **common, amount=int(doc["4"]), currency=currency, type=kind,
        original_stan=original[4:10], original_transmitted_at=_time_from(original[10:20], now=now),
        repeat=mti == "0421",
    )  # fmt: skip
    return Request(mti, doc["11"], sent, doc, reversal=reversal)


def _captured_at(doc: dict[str, str], sent: datetime | None) -> datetime | None:
    """Fields 13/12 (the terminal's wall clock, read as UTC), the year nearest field 7."""
    if "12" not in doc or "13" not in doc:
        return None
    return _time_from(doc["13"] + doc["12"], now=sent or datetime.now(UTC))


_ECHOED = ("3", "4", "7", "11", "12", "13", "37", "41", "42", "49", "70", "90")


def answer(request: Request, *, response_code: str, authorization_code: str | None = None) -> bytes:
    """The answer to ``request`` (0210/0410/0430/0810), echoing its identifying fields."""
    doc = {"t": ANSWER_MTI[request.mti], "39": response_code}
    doc.update((f, request.fields[f]) for f in _ECHOED if f in request.fields)
    if authorization_code is not None:
        doc["38"] = authorization_code
    return _encode(doc)
