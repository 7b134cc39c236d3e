"""``/v1/transactions``: create, lookup, abort, reversal (contract §2)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import traceback
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Protocol

import structlog
from fastapi import APIRouter, Path, Query, Request
from starlette.responses import Response

from api.auth import Authenticator
from api.config import Settings
from api.db import utcnow
from api.errors import (
    PROBLEM_JSON,
    ApiError,
    ServiceUnavailableError,
    unexpected,
    with_retry_after,
)
from api.events.writer import Event, EventWriter, RequestOutcome
from api.idempotency.keys import body_fingerprint, parse_key, parse_uuid
from api.idempotency.waiters import Waiters, preferred_wait
from api.metrics import CONFLICTS, LATENCY, REPLAYS, REQUESTS
from api.ratelimit import RateLimiter
from api.transactions import listing, resolution, waiting
from api.transactions.http import attempt_header, decode, network_header, read_body
from api.transactions.openapi import (
    CREATE_DESCRIPTION,
    CREATE_DOC,
    LIST_DOC,
    TRANSACTION_ID_DESCRIPTION,
    TRANSACTION_ID_EXAMPLE,
    by_id_doc,
    list_responses,
    responses,
)
from api.transactions.outcome import IdempotencyStatus, Outcome, from_error
from api.transactions.service import TransactionService

log = structlog.get_logger("idempay.http")
router = APIRouter(prefix="/v1/transactions", tags=["transactions"])

TransactionId = Annotated[
    str,
    Path(
        description=TRANSACTION_ID_DESCRIPTION,
        examples=[TRANSACTION_ID_EXAMPLE],
        json_schema_extra={"format": "uuid"},
    ),
]


class RouteContext(Protocol):
    """What the routes use of the process's context. The app's lifespan builds it
    (``api.main.build_context``: an ``api.context.AppContext``) and hands it to them as
    ``app.state.ctx``; nothing here builds or looks up anything else."""

    settings: Settings
    citus: bool
    service: TransactionService
    auth: Authenticator
    limiter: RateLimiter
    events: EventWriter
    waiters: Waiters


class _Call:
    """Per-request bookkeeping: who, which key, and the request event at the end."""

    def __init__(self, request: Request, endpoint: str) -> None:
        self.ctx: RouteContext = request.app.state.ctx
        self.endpoint = endpoint
        self.started = time.perf_counter()
        self.merchant_id: str | None = None
        self.key: str | None = None
        self.attempt = attempt_header(request) if endpoint == "create" else None
        self.network = network_header(request)
        self.request = request
        self.wait_s = preferred_wait(
            request.headers.getlist("prefer"), self.ctx.settings.prefer_wait_max
        )
        self.waited = False

    async def settled(self, look: Callable[[], Awaitable[Outcome]]) -> Outcome:
        """``look``'s answer; with ``Prefer: wait=N``, an in-flight one held until the key
        settles, the client goes away or the worker shuts down (waiting.py)."""
        if self.wait_s <= 0 or self.merchant_id is None or self.key is None:
            return await look()
        gone = asyncio.Event()
        watcher = asyncio.ensure_future(_disconnected(self.request, gone))
        try:
            outcome, self.waited = await waiting.until_settled(
                self.ctx.waiters,
                self.merchant_id,
                self.key,
                self.wait_s,
                look,
                gone=gone,
                read_only=self.endpoint == "lookup",
            )
        finally:
            watcher.cancel()
        return outcome

    async def run(
        self, work: Callable[[], Awaitable[Outcome]], reject_event: RequestOutcome
    ) -> Response:
        try:
            outcome = await work()
        except ApiError as error:
            outcome = from_error(
                error, event=reject_event, idempotency_status=IdempotencyStatus.NOT_FOUND
            )
        except Exception as exc:
            outcome = self._unexpected(exc)
        return self.respond(outcome)

    def _unexpected(self, exc: Exception) -> Outcome:
        """503 for storage down, else 500; either way nothing was stored under the key."""
        error = unexpected(
            exc,
            unavailable="Storage is unavailable; nothing was processed. Retry with the same key.",
            internal="Internal error; nothing was stored under the key. Retry with the same key.",
        )
        if isinstance(error, ServiceUnavailableError):
            log.warning(
                "storage_unavailable",
                endpoint=self.endpoint,
                error=type(exc).__name__,
                where=_where(exc),
            )
        else:
            log.exception("internal_error", endpoint=self.endpoint)
        error.retry_after = True  # a retry with the same key is safe (contract §2)
        create = self.endpoint == "create"
        return from_error(
            error,
            event=RequestOutcome.ERROR if create else RequestOutcome.NOT_RECORDED,
            idempotency_status=IdempotencyStatus.NOT_FOUND,
        )

    def respond(self, outcome: Outcome) -> Response:
        latency = time.perf_counter() - self.started
        REQUESTS.labels(self.endpoint, outcome.event).inc()
        LATENCY.labels(self.endpoint).observe(latency)
        if outcome.event == RequestOutcome.REPLAYED:
            REPLAYS.inc()
        elif outcome.event in (RequestOutcome.IN_PROGRESS, RequestOutcome.KEY_REUSED):
            CONFLICTS.inc()
        if self.merchant_id is not None and self.key is not None and outcome.event:
            self.ctx.events.record(
                Event(
                    ts=utcnow(),
                    merchant_id=self.merchant_id,
                    terminal_id=outcome.terminal_id,
                    idempotency_key=self.key,
                    endpoint=self.endpoint,
                    outcome=outcome.event,
                    http_status=outcome.status,
                    attempt=self.attempt,
                    network=self.network,
                    latency_ms=round(latency * 1000, 3),
                )
            )
        log.info(
            "request",
            endpoint=self.endpoint,
            status=outcome.status,
            outcome=outcome.event,
            key=self.key,
            merchant_id=self.merchant_id,
            latency_ms=round(latency * 1000, 2),
        )
        headers = with_retry_after(
            outcome.headers,
            wanted=outcome.retry_after,
            seconds=self.ctx.settings.retry_after_seconds,
        )
        if outcome.idempotency_status and self.endpoint not in ("reversal", "list"):
            headers["Idempotency-Status"] = outcome.idempotency_status
        if self.waited:
            headers["Preference-Applied"] = f"wait={self.wait_s}"
        media = PROBLEM_JSON if outcome.problem else "application/json"
        return Response(outcome.body, outcome.status, headers=headers, media_type=media)


async def _disconnected(request: Request, gone: asyncio.Event) -> None:
    """Sets ``gone`` when the client disconnects (the body, if any, is already read)."""
    with contextlib.suppress(Exception):
        while (await request.receive())["type"] != "http.disconnect":
            pass
        gone.set()


# What OpenAPI documents (its headers are CREATE_DOC's parameters): requests are served by
# ``handle_create`` through ``CreateRoute`` (api/transactions/lean.py), which reads the
# headers itself, so none is declared as a FastAPI parameter here.
@router.post(
    "",
    status_code=201,
    openapi_extra=CREATE_DOC,
    responses=responses("create"),
    summary="Process a payment",
    description=CREATE_DESCRIPTION,
)
async def create_transaction(request: Request) -> Response:
    return await handle_create(request)


async def handle_create(request: Request) -> Response:
    call = _Call(request, "create")

    async def work() -> Outcome:
        ctx = call.ctx
        principal, key_hash = await ctx.auth.principal(request)
        call.merchant_id = principal.merchant_id
        await ctx.limiter.check(key_hash)
        call.key = parse_key(request.headers.get("idempotency-key"))
        body = decode(await read_body(request))
        await ctx.limiter.check(key_hash, body.terminal_id)
        digest = body_fingerprint(body)
        merchant_id, key = call.merchant_id, call.key
        guard_s = principal.duplicate_guard_s  # loaded with the API key: no round trip

        async def create() -> Outcome:
            return await ctx.service.create(merchant_id, key, body, digest, guard_s=guard_s)

        async def again() -> Outcome:  # answered in flight if the worker's exit comes first
            return await waiting.before_exit(
                ctx.waiters, create, lambda: ctx.service.in_flight(body.terminal_id)
            )

        return await call.settled(again)

    return await call.run(work, RequestOutcome.REJECTED)


@router.get(
    "",
    response_model=listing.TransactionPage,
    responses=list_responses(),
    summary="List transactions",
    openapi_extra=LIST_DOC,
)
async def list_transactions(
    request: Request,
    since: Annotated[
        str,
        Query(
            description="RFC 3339: transactions created at or after this instant",
            json_schema_extra={"format": "date-time"},
        ),
    ],
    terminal_id: Annotated[
        str | None, Query(description="only this terminal's (1-64 of [A-Za-z0-9_.-])")
    ] = None,
    limit: Annotated[
        int | None,
        Query(ge=1, le=listing.MAX_LIMIT, description="page size (default 100)"),
    ] = None,
    cursor: Annotated[
        str | None, Query(description="next_cursor of the previous page (opaque)")
    ] = None,
) -> Response:
    """The caller's merchant's transactions created since `since` — one terminal's with
    `terminal_id` — oldest first (created_at, then id), in pages of `limit`; follow
    `next_cursor` until it is null. Another merchant's transactions never appear. A bad
    parameter is 422 `validation_error`. A terminal that lost its journal reconciles from
    here."""
    # the parameters are read by ``listing.parse`` (the declared ones document them)
    call = _Call(request, "list")

    async def work() -> Outcome:
        ctx = call.ctx
        merchant_id, key_hash = await ctx.auth.authenticate(request)
        await ctx.limiter.check(key_hash)
        query = listing.parse(request.query_params)
        return await listing.page(ctx.service, merchant_id, query, citus=ctx.citus)

    return await call.run(work, RequestOutcome.NOT_RECORDED)


def _by_id(endpoint: str, action: Callable[..., Awaitable[Outcome]]) -> Any:
    async def handler(request: Request, transaction_id: TransactionId) -> Response:
        call = _Call(request, endpoint)

        async def work() -> Outcome:
            ctx = call.ctx
            merchant_id, key_hash = await ctx.auth.authenticate(request)
            await ctx.limiter.check(key_hash)
            key = parse_uuid(transaction_id)
            call.merchant_id, call.key = merchant_id, key

            async def again() -> Outcome:
                return await action(ctx.service, merchant_id, key)

            return await call.settled(again)

        refused = RequestOutcome.REJECTED if endpoint == "reversal" else RequestOutcome.NOT_RECORDED
        return await call.run(work, refused)

    return handler


handle_lookup = _by_id("lookup", resolution.lookup)  # also served by lean.CreateRoute
router.add_api_route(
    "/{transaction_id}",
    handle_lookup,
    methods=["GET"],
    openapi_extra=by_id_doc("lookupTransaction", prefer=True),
    responses=responses("lookup"),
    summary="Look up a key",
    description="What happened to a key whose answer the terminal never got: 200 processed "
    "(use this result, do not resend), 202 still in flight (look again after `Retry-After`), "
    "404 nothing was processed (resending the same request with the same key is safe), 410 "
    "fenced (never processed, and never will be).",
)
router.add_api_route(
    "/{transaction_id}/abort",
    _by_id("abort", resolution.abort),
    methods=["POST"],
    openapi_extra=by_id_doc("abortTransaction", prefer=True),
    responses=responses("abort"),
    summary="Fence an in-doubt key",
    description="A definitive answer for a terminal that must give up: if nothing was "
    "processed under the key, the key is fenced (`aborted`) and any later create with it is "
    "410 `transaction_aborted`, never processed; if it was processed, nothing changes and the "
    "answer is the transaction. Idempotent.",
)
router.add_api_route(
    "/{transaction_id}/reversal",
    _by_id("reversal", resolution.reverse),
    methods=["POST"],
    openapi_extra=by_id_doc("reverseTransaction", prefer=False),
    responses=responses("reversal"),
    summary="Reverse a transaction",
    description="Undoes an approved transaction (and its ledger entries) exactly once, the "
    "card-network answer to a customer charged who left without the goods. Idempotent: a "
    "repeat answers the same reversed transaction. 422 `not_reversible` for a declined "
    "transaction.",
)


def _where(exc: BaseException, depth: int = 4) -> str:
    """The innermost ``api`` frames an error came through (``file:line function``, innermost
    last): which write or read met the outage, for the operator reading the log."""
    frames = [
        f"{os.path.basename(frame.filename)}:{frame.lineno} {frame.name}"
        for frame in traceback.extract_tb(exc.__traceback__)
        if f"{os.sep}api{os.sep}" in frame.filename
    ]
    return " > ".join(frames[-depth:])
