"""The benchmark baseline: create with the idempotency layer bypassed.

Mounted only when ``IDEMPAY_BENCH_BYPASS=true``. It does the same work as a create minus
idempotency: auth, rate limit, body checks, the issuer (enlisted), the transaction, ledger
and outbox inserts in one transaction — no key read, no key row, no stored response, no
request event.
`make bench` compares idempay's create against it, side by side in one run.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from api.context import AppContext
from api.db import atomic, utcnow
from api.errors import ApiError, problem_response
from api.idempotency.keys import parse_key
from api.outbox import writer as outbox
from api.transactions import repository
from api.transactions.http import decode, read_body

router = APIRouter(prefix="/_bench", include_in_schema=False)


@router.post("/transactions")
async def create_bypassed(request: Request) -> Response:
    ctx: AppContext = request.app.state.ctx
    service = ctx.service
    try:
        merchant_id, key_hash = await ctx.auth.merchant_for(request.headers.get("authorization"))
        await ctx.limiter.check(key_hash)
        key = parse_key(request.headers.get("idempotency-key"))
        body = decode(await read_body(request))
        await ctx.limiter.check(key_hash, body.terminal_id)
    except ApiError as error:
        return problem_response(error)
    now = utcnow()
    async with atomic(service.engine) as conn:
        auth = await service.issuer.authorize(
            service.auth_request(merchant_id, key, body), conn=conn
        )
        txn = service.new_transaction(merchant_id, key, body, auth, created_at=now)
        text = repository.render(txn)
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
