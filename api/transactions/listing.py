"""``GET /v1/transactions``: a merchant's transactions, for one terminal or all, in pages.

A terminal that lost its journal (device swap, factory reset) reconciles from here
(``client.reconcile(since=…)``). Keyset pagination in commit order — ``listing_pos``
(migration 0011), then ``created_at``, then ``id`` — so a page never skips or repeats a row
however many transactions arrive or commit meanwhile (``page``). The cursor is opaque to
clients: the last row's position, base64url-encoded and signed (HMAC with ``secret_key``)
for the merchant, ``terminal_id`` and ``since`` it was returned for; any other is 422.
Only the caller's merchant is ever read.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field
from sqlalchemy import and_, literal_column, or_, select
from starlette.datastructures import QueryParams

from api.errors import ValidationFailedError
from api.events.writer import RequestOutcome
from api.headers import parse_positive_int, parse_rfc3339
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
    moment = parse_rfc3339(text)
    if moment is None:
        raise _error(
            name,
            "must be an RFC 3339 date-time with a time zone (e.g. 2026-11-20T00:00:00Z; at"
            " most 6 fraction digits) between years 1 and 9999 in UTC",
        )
    return moment


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
    limit = parse_positive_int(params.get("limit", str(DEFAULT_LIMIT)), max_digits=3)
    if limit is None or limit > MAX_LIMIT:
        raise _error("limit", f"an integer from 1 to {MAX_LIMIT}")
    return Query(
        terminal_id=terminal,
        since=_aware("since", since_text),
        limit=limit,
        cursor=params.get("cursor"),  # an empty one too: refused in ``page``
    )


# The lowest position a transaction unfinished at this statement's snapshot may still commit:
# the least of the snapshot's in-progress ids (``pg_snapshot_xip``), or its xmax. An id seen
# running in *another* database (pg_stat_activity: a backend's database never changes) cannot
# write our table and is left out, so another database's long transaction (a migration, a
# CREATE DATABASE on a shared server) does not hold the listing back; anything else — ours,
# finished since the snapshot, a prepared transaction, a subtransaction, a row hidden from
# us — counts. (backend_xid is 32 bits: compared modulo 2^32.)
_UNFINISHED = """(
SELECT COALESCE(
  (SELECT min(x::text::bigint) FROM pg_snapshot_xip(s.snap) AS x
   WHERE x::text::bigint % 4294967296 NOT IN (
     SELECT a.backend_xid::text::bigint FROM pg_stat_activity AS a
     WHERE a.backend_xid IS NOT NULL AND a.datid IS NOT NULL
       AND a.datid <> (SELECT oid FROM pg_database WHERE datname = current_database()))),
  pg_snapshot_xmax(s.snap)::text::bigint)
FROM (SELECT pg_current_snapshot() AS snap) AS s)"""


def _after(table: Any, by_position: bool, after: list[Any]) -> Any:
    """Rows after the cursor's row, in the page order."""
    try:
        if by_position:
            kind, pos, created_text, last_id = after
            if kind != "p" or not isinstance(pos, int):
                raise ValueError
        else:
            kind, created_text, last_id = after
            if kind != "t":
                raise ValueError
        last_created = datetime.fromisoformat(created_text)
    except (ValueError, TypeError):  # signed by us, but for the other order: not this query's
        raise _error("cursor", "not a cursor this endpoint returned") from None
    created, txn_id = table.c.created_at, table.c.id
    later = or_(created > last_created, and_(created == last_created, txn_id > last_id))
    if not by_position:
        return later
    listing_pos = table.c.listing_pos
    return or_(listing_pos > pos, and_(listing_pos == pos, later))


async def page(
    service: TransactionService, merchant_id: str, query: Query, *, citus: bool
) -> Outcome:
    """One page of ``merchant_id``'s transactions, in commit order (finding C of the review
    of issue 16): by ``listing_pos`` (migration 0011), then created_at, then id. On Postgres
    only rows below the oldest transaction still running are read — a row committed later
    always has a higher position — so resuming from a cursor never skips one. On Citus
    (``citus``: the app's start-up probe, ``api.main``), for now, by (created_at, id) —
    migration 0011 leaves ``listing_pos`` out there — which can skip a row committed after
    the cursor passed its created_at (docs/contract.md §2.7)."""
    secret = service.settings.secret_key
    after = decode_cursor(secret, merchant_id, query)
    table = Transaction.__table__
    created, txn_id, listing_pos = table.c.created_at, table.c.id, table.c.listing_pos
    conditions: list[Any] = [table.c.merchant_id == merchant_id, created >= query.since]
    if query.terminal_id is not None:
        conditions.append(table.c.terminal_id == query.terminal_id)
    by_position = not citus
    async with service.reader.connect() as conn:
        if after is not None:
            conditions.append(_after(table, by_position, after))
        order: tuple[Any, ...] = (created, txn_id)
        if by_position:
            order = (listing_pos, created, txn_id)
            if conn.dialect.name == "postgresql":  # nothing an unfinished writer may commit
                conditions.append(listing_pos < literal_column(_UNFINISHED))
        statement = select(table).where(*conditions).order_by(*order).limit(query.limit + 1)
        rows = list((await conn.execute(statement)).all())
    more = len(rows) > query.limit
    rows = rows[: query.limit]
    next_cursor = None
    if more:
        last = rows[-1]
        position: list[Any] = ["t", last.created_at.isoformat(), last.id]
        if by_position:
            position = ["p", last.listing_pos, last.created_at.isoformat(), last.id]
        next_cursor = encode_cursor(secret, merchant_id, query, position)
    body = {"data": [repository.body_of(row) for row in rows], "next_cursor": next_cursor}
    text_ = json.dumps(body, separators=(",", ":")).encode()
    return Outcome(200, text_, RequestOutcome.FOUND)
