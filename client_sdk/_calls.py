"""Single API calls (lookup, abort, reversal, the listing) as sans-I/O generators.

Each is idempotent on the server, so network failures, 429 and 5xx are retried up to
``max_retries`` times with backoff; every other answer is returned or raised as-is.
These calls do not write the journal: ``recover()`` is what settles journal entries. Abort
and reversal read it, though: a payment the terminal sold offline and has not forwarded
(STORED) is never aborted — ``StoredPaymentError``, nothing sent.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Literal
from urllib.parse import urlencode

from ._context import Context, send, sleep
from ._effects import HttpReply, NoReply, Peek, Steps
from ._exceptions import APIConnectionError, StoredPaymentError, error_from_response
from ._journal import JournalEntry
from ._models import Fenced, JournalState, Processing, Transaction
from ._request import iso_utc
from ._retry import parse_retry_after

__all__ = ["abort", "lookup", "reverse", "transactions"]


def _call(
    ctx: Context, method: Literal["GET", "POST"], path: str, *, max_retries: int
) -> Steps[HttpReply]:
    attempt = 0
    while True:
        attempt += 1
        reply = yield from send(ctx, method, path, timeout=ctx.timeout)
        retryable = isinstance(reply, NoReply) or reply.status == 429 or reply.status >= 500
        if not retryable or attempt > max_retries:
            break
        header = reply.headers.get("retry-after") if isinstance(reply, HttpReply) else None
        retry_after = parse_retry_after(header, ctx.now())
        yield from sleep(ctx.policy.wait(attempt, retry_after, ctx.rng))
    if isinstance(reply, NoReply):
        raise APIConnectionError(f"{method} {path}: {reply.error}", sent=reply.sent)
    return reply


def _transaction(reply: HttpReply) -> Transaction:
    try:
        return Transaction.from_json(reply.body)
    except ValueError as exc:
        raise error_from_response(reply.status, reply.headers, reply.body) from exc


def lookup(ctx: Context, key: str, *, max_retries: int) -> Steps[Transaction | Processing]:
    """GET by key: the transaction, or Processing; NotFoundError / TransactionAbortedError /
    RequestExpiredError and the other errors are raised."""
    reply = yield from _call(ctx, "GET", f"/v1/transactions/{key}", max_retries=max_retries)
    if reply.status == 202:
        wait = parse_retry_after(reply.headers.get("retry-after"), ctx.now())
        return Processing(id=key, retry_after=wait)
    if reply.status == 200:
        return _transaction(reply)
    raise error_from_response(reply.status, reply.headers, reply.body)


def _not_stored(key: str, action: str) -> Steps[None]:
    entry = yield Peek(key)
    if isinstance(entry, JournalEntry) and entry.state is JournalState.STORED:
        raise StoredPaymentError(
            f"payment {key} was sold offline and is not forwarded yet: it is never "
            f"{action}; forward it (client.forward()), then reverse it if needed",
            key=key,
        )


def abort(ctx: Context, key: str, *, max_retries: int) -> Steps[Transaction | Fenced]:
    """Fence the key: Fenced, or the transaction if it had been processed."""
    yield from _not_stored(key, "aborted")
    path = f"/v1/transactions/{key}/abort"
    reply = yield from _call(ctx, "POST", path, max_retries=max_retries)
    if reply.status != 200:
        raise error_from_response(reply.status, reply.headers, reply.body)
    status = reply.body.get("status") if isinstance(reply.body, Mapping) else None
    if status == "aborted" or status == "expired":
        return Fenced(id=key, status=status)
    return _transaction(reply)


def reverse(ctx: Context, key: str, *, max_retries: int) -> Steps[Transaction]:
    """Reverse a processed approval (idempotent): the reversed transaction."""
    yield from _not_stored(key, "reversed before it is forwarded")
    path = f"/v1/transactions/{key}/reversal"
    reply = yield from _call(ctx, "POST", path, max_retries=max_retries)
    if reply.status != 200:
        raise error_from_response(reply.status, reply.headers, reply.body)
    return _transaction(reply)


def transactions(
    ctx: Context, *, terminal_id: str, since: datetime, page_size: int, max_retries: int
) -> Steps[list[Transaction]]:
    """Every transaction of the terminal created since ``since``, oldest first, following
    the listing's cursor page after page (``GET /v1/transactions``)."""
    found: list[Transaction] = []
    params = {"terminal_id": terminal_id, "since": iso_utc(since), "limit": str(page_size)}
    while True:
        path = "/v1/transactions?" + urlencode(params)
        reply = yield from _call(ctx, "GET", path, max_retries=max_retries)
        body = reply.body
        if reply.status != 200 or not isinstance(body, Mapping):
            raise error_from_response(reply.status, reply.headers, reply.body)
        found += [Transaction.from_json(item) for item in body.get("data") or []]
        cursor = body.get("next_cursor")
        if not isinstance(cursor, str):
            return found
        params["cursor"] = cursor
