"""``GET /v1/transactions``: a merchant's transactions, for one terminal or all, in pages.

A terminal that lost its journal (device swap, factory reset) reconciles from here
(``client.reconcile(since=…)``). Keyset pagination in a stable order — ``created_at``, then
``id`` — so a page never skips or repeats a row however many transactions arrive meanwhile
(new ones sort after the cursor or before ``since``). The cursor is opaque to clients: the
last row's (created_at, id), base64url-encoded. Only the caller's merchant is ever read.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, Field
from sqlalchemy import and_, or_, select
from starlette.datastructures import QueryParams

from api.errors import ValidationFailedError
from api.events.writer import RequestOutcome
from api.models import Transaction
from api.transactions import repository
from api.transactions.outcome import Outcome
from api.transactions.schemas import TransactionOut
from api.transactions.service import TransactionService

DEFAULT_LIMIT = 100
MAX_LIMIT = 500
_TERMINAL = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
_PARAMS = frozenset({"terminal_id", "since", "limit", "cursor"})


class TransactionPage(BaseModel):
    """One page of the listing; ``next_cursor`` is null on the last page."""

    data: list[TransactionOut]
    next_cursor: str | None = Field(
        description="pass as ?cursor= (with the same terminal_id and since) for the next page"
    )


@dataclass(frozen=True, slots=True)
class Query:
    terminal_id: str | None
    since: datetime
    limit: int
    cursor: str | None  # as given: verified against the caller's merchant in ``page``


def _error(name: str, message: str) -> ValidationFailedError:
    error = {"loc": ["query", name], "msg": message, "type": "value_error"}
    return ValidationFailedError(
        f"Bad query parameter {name!r}: {message}.", extra={"errors": [error]}
    )


def _aware(name: str, text: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise _error(name, "must be an RFC 3339 date-time") from None
    if moment.tzinfo is None:
        raise _error(name, "must carry a time zone (e.g. Z)")
    try:  # 0001-01-01T00:00:00+14:00 is RFC 3339 but before year 1 in UTC (was a 500)
        return moment.astimezone(UTC)
    except OverflowError:
        raise _error(name, "out of range: not an instant between years 1 and 9999 in UTC") from None


def _mac(secret: str, merchant_id: str, query: Query, payload: bytes) -> str:
    """The cursor's signature: it binds the position to the merchant, terminal and since it
    was returned for — a cursor this endpoint did not return (forged, edited, another
    merchant's, another query's) is refused before anything is read."""
    message = json.dumps(
        [merchant_id, query.terminal_id, query.since.isoformat()], separators=(",", ":")
    ).encode()
    digest = hmac.new(
        secret.encode(), b"idempay-listing-cursor\0" + message + b"\0" + payload, hashlib.sha256
    )
    return base64.urlsafe_b64encode(digest.digest()[:18]).decode()


def encode_cursor(secret: str, merchant_id: str, query: Query, position: list[Any]) -> str:
    """An opaque cursor: the last row's position, base64url, then its signature."""
    payload = json.dumps(position, separators=(",", ":")).encode()
    text = base64.urlsafe_b64encode(payload).decode().rstrip("=")
    return f"{text}.{_mac(secret, merchant_id, query, payload)}"


def decode_cursor(secret: str, merchant_id: str, query: Query) -> list[Any] | None:
    """The position a cursor carries, None without one; 422 for one this endpoint did not
    return for this merchant and query (an empty one included)."""
    if query.cursor is None:
        return None
    try:
        text, mac = query.cursor.split(".")
        payload = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        if not hmac.compare_digest(
            mac.encode(), _mac(secret, merchant_id, query, payload).encode()
        ):
            raise ValueError
        position = json.loads(payload)
        if not isinstance(position, list):
            raise ValueError
        return position
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError):
        raise _error("cursor", "not a cursor this endpoint returned") from None


def parse(params: QueryParams) -> Query:
    """The query, validated: unknown or repeated parameters, a missing ``since`` and a bad
    value are 422 ``validation_error`` (problem+json, ``errors`` naming the parameter)."""
    for name in params:
        if name not in _PARAMS:
            raise _error(name, "unknown parameter")
        if len(params.getlist(name)) > 1:
            raise _error(name, "given more than once")
    terminal = params.get("terminal_id")
    if terminal is not None and not _TERMINAL.fullmatch(terminal):
        raise _error("terminal_id", "1-64 characters of [A-Za-z0-9_.-]")
    since_text = params.get("since")
    if since_text is None:
        raise _error("since", "required (RFC 3339, e.g. 2026-11-20T00:00:00Z)")
    limit_text = params.get("limit", str(DEFAULT_LIMIT))
    if not (limit_text.isascii() and limit_text.isdigit() and 1 <= int(limit_text) <= MAX_LIMIT):
        raise _error("limit", f"an integer from 1 to {MAX_LIMIT}")
    return Query(
        terminal_id=terminal,
        since=_aware("since", since_text),
        limit=int(limit_text),
        cursor=params.get("cursor"),  # an empty one too: refused in ``page``
    )


async def page(service: TransactionService, merchant_id: str, query: Query) -> Outcome:
    """One page of ``merchant_id``'s transactions, oldest first."""
    secret = service.settings.secret_key
    after = decode_cursor(secret, merchant_id, query)
    table = Transaction.__table__
    created, txn_id = table.c.created_at, table.c.id
    conditions: list[Any] = [table.c.merchant_id == merchant_id, created >= query.since]
    if query.terminal_id is not None:
        conditions.append(table.c.terminal_id == query.terminal_id)
    if after is not None:
        last_created, last_id = datetime.fromisoformat(after[0]), after[1]
        conditions.append(
            or_(created > last_created, and_(created == last_created, txn_id > last_id))
        )
    statement = select(table).where(*conditions).order_by(created, txn_id).limit(query.limit + 1)
    async with service.reader.connect() as conn:
        rows = list((await conn.execute(statement)).all())
    more = len(rows) > query.limit
    rows = rows[: query.limit]
    next_cursor = None
    if more:
        last = [rows[-1].created_at.isoformat(), rows[-1].id]
        next_cursor = encode_cursor(secret, merchant_id, query, last)
    body = {"data": [repository.body_of(row) for row in rows], "next_cursor": next_cursor}
    text = json.dumps(body, separators=(",", ":")).encode()
    return Outcome(200, text, RequestOutcome.FOUND)
