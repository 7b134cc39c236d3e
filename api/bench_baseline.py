"""The benchmark's baseline: a create with the idempotency layer bypassed.

``make bench`` measures idempay's create beside this baseline, side by side in one run
(docs/benchmarks.md, "The bypassed baseline"). It does the same work as a create minus
idempotency: auth, rate limit, body checks, one 0200 through the server's own acquirer link
(no transaction open), then the transaction, ledger and outbox inserts in one transaction —
no claim, no key row, no stored response, no request event: one commit where the create has
two.

Nothing in ``api`` routes to it, and no setting mounts it: it skips the failed-authentication
limiter and has no idempotency (a lost answer is never reversed). Only the bench's own app
(``loadtest/_bench_app.py``) serves it, as ``POST /_bench/transactions``. It lives here
because it is made of the create's internals, which ``loadtest`` may not import
(``[tool.importlinter]`` in pyproject.toml): this function is the one surface it gets.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from api.acquirer.types import AcquirerError
from api.context import AppContext
from api.db import atomic, utcnow
from api.errors import ApiError, ServiceUnavailableError, problem_response
from api.idempotency.keys import parse_key
from api.outbox import writer as outbox
from api.transactions import repository
from api.transactions.http import decode, read_body


async def create_bypassed(request: Request) -> Response:
    """Answer one create without the idempotency layer (201, or the create's problem)."""
    ctx: AppContext = request.app.state.ctx
    service = ctx.service
    retry_after = ctx.settings.retry_after_seconds
    try:
        merchant_id, key_hash = await ctx.auth.merchant_for(request.headers.get("authorization"))
        await ctx.limiter.check(key_hash)
        key = parse_key(request.headers.get("idempotency-key"))
        body = decode(await read_body(request))
        await ctx.limiter.check(key_hash, body.terminal_id)
    except ApiError as error:
        return problem_response(error, retry_after_seconds=retry_after)
    now = utcnow()
    try:
        auth = await service.acquirer.authorize(
            service.auth_request(merchant_id, key, body),
            timeout_s=ctx.settings.acquirer_timeout,
        )
    except AcquirerError as exc:  # no verdict: the baseline keeps nothing and says so
        unavailable = ServiceUnavailableError(f"acquirer: {type(exc).__name__}")
        return problem_response(unavailable, retry_after_seconds=retry_after)
    txn = service.new_transaction(merchant_id, key, body, auth, created_at=now)
    text = repository.render(txn)
    async with atomic(service.engine) as conn:
        await repository.insert_transaction(conn, txn)
        await outbox.append(
            conn,
            merchant_id=merchant_id,
            event_type=outbox.COMPLETED,
            transaction_id=key,
            data=repository.body_of(txn),
            now=txn.processed_at,
        )
    return Response(text.encode(), 201, media_type="application/json")
