"""Single API calls (lookup, abort, reversal) as sans-I/O generators.

Each is idempotent on the server, so network failures, 429 and 5xx are retried up to
``max_retries`` times with backoff; every other answer is returned or raised as-is.
These calls do not touch the journal: ``recover()`` is what settles journal entries.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from ._context import Context, send, sleep
from ._effects import HttpReply, NoReply, Steps
from ._exceptions import APIConnectionError, error_from_response
from ._models import Fenced, Processing, Transaction
from ._retry import parse_retry_after

__all__ = ["abort", "lookup", "reverse"]


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


def abort(ctx: Context, key: str, *, max_retries: int) -> Steps[Transaction | Fenced]:
    """Fence the key: Fenced, or the transaction if it had been processed."""
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
    path = f"/v1/transactions/{key}/reversal"
    reply = yield from _call(ctx, "POST", path, max_retries=max_retries)
    if reply.status != 200:
        raise error_from_response(reply.status, reply.headers, reply.body)
    return _transaction(reply)
