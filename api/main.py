"""``create_app(settings)``: the FastAPI application, its lifespan and its error handlers."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.acquirer.runtime import AcquirerRuntime
from api.acquirer.worker import AdviceWorker
from api.auth import Authenticator
from api.config import GRACEFUL_SHUTDOWN_S, Settings
from api.context import AppContext
from api.db import DriverPool, create_engine, split_budget
from api.docs_page import mount_docs
from api.errors import ApiError, ValidationFailedError, problem_response, unexpected
from api.events.writer import EventWriter, SqliteBatches
from api.http_limits import BodyDeadlineMiddleware
from api.idempotency.cache import ResponseCache
from api.idempotency.waiters import Waiters, listen_args
from api.logs import configure_logging
from api.migrate import has_citus
from api.ops import router as ops_router
from api.ratelimit import RateLimiter
from api.storage_errors import misconfigured
from api.transactions import delegated
from api.transactions.completer import Completer
from api.transactions.http import MAX_BODY_BYTES
from api.transactions.inline import HotReads
from api.transactions.lean import CreateRoute
from api.transactions.openapi import add_component_schemas
from api.transactions.router import router as transactions_router
from api.transactions.service import TransactionService

log = structlog.get_logger("idempay")
_SAFE_REQUEST_ID = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


class RequestIdMiddleware:
    """Every response carries ``X-Request-Id`` (the client's, if it is safe, else a new one)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = ""
        for name, value in scope["headers"]:
            if name == b"x-request-id":
                candidate = value.decode("latin-1")
                if 0 < len(candidate) <= 128 and set(candidate) <= _SAFE_REQUEST_ID:
                    request_id = candidate
        request_id = request_id or uuid.uuid4().hex
        structlog.contextvars.bind_contextvars(request_id=request_id)

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers.append((b"x-request-id", request_id.encode()))
                message["headers"] = headers
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            structlog.contextvars.unbind_contextvars("request_id")


def create_redis(settings: Settings) -> Any | None:
    """A Redis client sized for bursts: a blocking pool (wait briefly for a connection
    instead of failing), short socket timeouts, so a sick Redis degrades quickly."""
    if not settings.redis_url:
        return None
    import redis.asyncio as aioredis

    pool = aioredis.BlockingConnectionPool.from_url(
        settings.redis_url,
        max_connections=settings.redis_pool_size,
        timeout=settings.redis_timeout,
        socket_timeout=settings.redis_timeout,
        socket_connect_timeout=settings.redis_timeout,
        health_check_interval=30,
    )
    return aioredis.Redis(connection_pool=pool)


def hot_reads(settings: Settings) -> HotReads | None:
    """The hot path's key reads (api/transactions/inline.py): prepared statements on the hot
    path's own asyncpg pool (its share of ``IDEMPAY_DB_POOL_SIZE``, ``split_budget``), or
    SQLite's reader thread beside the writer thread the request events ride (not for
    ``:memory:``). Closed by the lifespan after the last request (``service.inline.close()``)."""
    if not settings.is_sqlite:
        from api.transactions.pg_create import PgInline

        _engine_share, hot_share = split_budget(settings.db_pool_size)
        pool = DriverPool(settings.resolved_database_url, hot_share, timeout=settings.db_timeout)
        return PgInline(pool)
    path = settings.resolved_database_url.split("///", 1)[1]
    if not path or path == ":memory:":
        return None
    from api.transactions.sqlite_create import SqliteInline

    return SqliteInline(path)


# How long a starting worker waits for its database to answer the Citus probe. The deployed
# API starts with --no-migrate, so nothing before it has waited: a replica (re)started while
# Postgres is down or failing over waits here, logging, instead of failing its start at once.
# Under the Kubernetes startupProbe's 60 s (deploy/k8s/base/api-deployment.yaml), so the
# worker itself reports the failure.
STARTUP_WAIT_SECONDS = 45.0


async def database_has_citus(engine: AsyncEngine, *, wait: float = STARTUP_WAIT_SECONDS) -> bool:
    """The process's one Citus probe (``pg_extension``), asked by ``build_context``: the
    answer never changes while the database runs. SQLite: False, without a query. A database
    that does not answer is asked again (0.25 s, doubling to 4 s) for up to ``wait`` seconds;
    then the last error is raised and the start fails. Bad credentials or a database that
    does not exist fail at once (``misconfigured``): waiting would not help."""
    if engine.dialect.name != "postgresql":
        return False
    deadline = asyncio.get_running_loop().time() + wait
    pause = 0.25
    while True:
        try:
            async with engine.connect() as conn:
                return await conn.run_sync(has_citus)
        except Exception as exc:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0 or misconfigured(exc):
                raise
            log.warning("database_unavailable_at_start", error=type(exc).__name__, retry_s=pause)
            await asyncio.sleep(min(pause, left))
            pause = min(pause * 2, 4.0)


async def _delegated_calls(engine: AsyncEngine) -> bool:
    """On Citus: the create's delegated calls are installed (``idempay migrate`` installs
    them); a database migrated by an older release writes its batches as transactions."""
    async with engine.connect() as conn:
        return await conn.run_sync(delegated.installed)


async def build_context(settings: Settings) -> AppContext:
    """Everything the routes need. Asks the database once whether it has Citus, and hands
    the answer to each part that writes or reads differently there (the event writer, the
    listing); a database that does not answer
    within ``STARTUP_WAIT_SECONDS`` fails the start."""
    engine_share, hot_share = split_budget(settings.db_pool_size)
    engine = create_engine(settings, pool_size=engine_share)
    try:
        citus = await database_has_citus(engine)
        delegate = citus and await _delegated_calls(engine)
    except BaseException:
        await engine.dispose()
        raise
    try:
        acquirer = await AcquirerRuntime.open(settings)
    except BaseException:
        await engine.dispose()
        raise
    redis = create_redis(settings)
    cache = ResponseCache(
        redis,
        prefix=settings.redis_prefix,
        ttl=settings.cache_ttl,
        lookup_ttl=settings.lookup_cache_ttl,
        busy_ttl=settings.acquirer_timeout + settings.lease_seconds,
    )
    inline = hot_reads(settings)
    # SQLite: the request events' flushes ride the hot path's writer thread (one per database)
    sqlite_batches = inline if isinstance(inline, SqliteBatches) else None
    return AppContext(
        settings=settings,
        engine=engine,
        citus=citus,
        service=TransactionService(
            engine,
            acquirer.link,
            settings,
            cache=cache,
            inline=inline,
            citus=citus,
            delegate=delegate,
        ),
        acquirer=acquirer,
        auth=Authenticator(engine),
        limiter=RateLimiter(
            per_key=settings.rate_limit,
            per_terminal=settings.rate_limit_terminal,
            redis_url=settings.redis_url,
            prefix=f"{settings.redis_prefix}rl",
        ),
        events=EventWriter(
            engine,
            citus=citus,
            batch_size=settings.event_batch_size,
            interval=settings.event_flush_interval,
            max_queue=settings.event_queue_max,
            sqlite=sqlite_batches,
        ),
        waiters=Waiters(
            limit=settings.waiters_max,
            listen_dsn=listen_args(settings.resolved_database_url),
            # SQLite has no NOTIFY, and on Citus the key rows' triggers fire on the workers,
            # whose NOTIFY never reaches the API: a key settled by another process (a second
            # worker, the CLI) is seen by a look once a second
            recheck_s=RECHECK_S if settings.is_sqlite or citus else None,
            # woken waiters look again through half the hot path's connections at most: a
            # herd on one key never starves the other requests' pool (waiting.py)
            look_slots=hot_share // 2,
        ),
        redis=redis,
    )


async def _purge_forever(ctx: AppContext) -> None:
    from api.retention import purge

    while True:
        await asyncio.sleep(ctx.settings.purge_interval)
        try:
            report = await purge(
                ctx.engine,
                retention_seconds=ctx.settings.tombstone_retention,
                tolerance_seconds=ctx.settings.clock_skew_tolerance,
            )
            log.info(
                "retention_purge",
                tombstones=report.tombstones,
                request_events=report.request_events,
                outbox_events=report.outbox_events,
            )
        except Exception as exc:  # storage down: next interval
            log.warning("retention_purge_failed", error=type(exc).__name__)


RECHECK_S = 1.0


# ``GRACEFUL_SHUTDOWN_S`` (api/config.py) is uvicorn's ``timeout_graceful_shutdown``: after
# it, the requests still in flight are cancelled and answered a bare text/plain 500 by
# uvicorn. A create still at work ``EXIT_ANSWER_MARGIN_S`` before that is answered in flight
# by the app itself (409 problem+json, ``Retry-After``: ``waiting.before_exit``).
EXIT_ANSWER_MARGIN_S = 3


def _close_waiters_on_exit_signal(waiters: Waiters) -> None:
    """On SIGTERM/SIGINT, before uvicorn's graceful shutdown waits for the requests in
    flight, requests held by ``Prefer: wait`` answer at once with their last look (they
    would otherwise hold the shutdown until uvicorn cancels them with a bare 500); and
    ``GRACEFUL_SHUTDOWN_S - EXIT_ANSWER_MARGIN_S`` later, creates still at work are answered
    in flight (``waiters.pass_exit``, ``waiting.before_exit``), not left to uvicorn's bare
    500. The handler uvicorn installed is chained, not replaced; outside the main thread
    (tests driving the app in process) there is no signal to chain.

    A SIGINT after an exit signal (Ctrl-C again, or after a SIGTERM) answers the creates
    still at work at once, in flight, and lets the shutdown go on gracefully — its lifespan
    still flushes the request events and lets the 0200s out end — rather than handing it to
    uvicorn, whose "force exit" would skip the lifespan and answer them a bare 500. A third
    forces the exit.
    """
    loop = asyncio.get_running_loop()
    exiting = False  # an exit signal came (SIGTERM or SIGINT)
    held = False  # a SIGINT after it was answered here rather than forcing the exit

    def on_exit() -> None:
        if waiters.closing:
            return  # a second signal: the first one's timers stand
        waiters.close()
        loop.call_later(GRACEFUL_SHUTDOWN_S - EXIT_ANSWER_MARGIN_S, waiters.pass_exit)

    def on_second_interrupt() -> None:
        on_exit()
        waiters.pass_exit()

    for sig in (signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(sig)
        if not callable(previous):
            continue

        def handler(
            signum: int, frame: Any, previous: Callable[[int, Any], Any] = previous
        ) -> None:
            nonlocal exiting, held
            if signum == signal.SIGINT and exiting and not held:
                # uvicorn would force the exit (after a SIGTERM too): answer, then go on
                held = True
                loop.call_soon_threadsafe(on_second_interrupt)
                return
            exiting = True
            loop.call_soon_threadsafe(on_exit)
            previous(signum, frame)

        with contextlib.suppress(ValueError):  # not the main thread
            signal.signal(sig, handler)


def settle_heap(settings: Settings) -> bool:
    """Start-up interpreter settings (``IDEMPAY_GC_THRESHOLD``, ``IDEMPAY_SWITCH_INTERVAL``,
    ``IDEMPAY_GC_FREEZE``): set the thresholds and the GIL switch interval, then freeze what
    is alive — the imported modules, the app, the context — so a full collection under load
    walks only the objects made since, not the whole start-up heap (~136,000 objects: a full
    collection paused the event loop 100–600 ms under load, docs/benchmarks.md, "Frozen
    start-up heap"). The young generations are collected first; a full collection is not
    (it costs as much as the pause it avoids, at every start — a test process starts many
    apps), so
    start-up garbage already in the oldest generation stays, frozen, for the process's
    life: bounded, once. Returns whether it froze; the lifespan unfreezes at shutdown (an
    app started again in the same process, as the tests do, leaves nothing behind in the
    permanent generation)."""
    if settings.gc_thresholds:
        gc.set_threshold(*settings.gc_thresholds)
    if settings.resolved_switch_interval:
        sys.setswitchinterval(settings.resolved_switch_interval)
    if not settings.gc_freeze:
        return False
    gc.collect(1)
    gc.freeze()
    return True


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    configure_logging(settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        ctx = await build_context(settings)
        app.state.ctx = ctx
        events = asyncio.create_task(ctx.events.run_forever(), name="events")
        tasks: list[asyncio.Task[None]] = []
        if settings.completer_enabled:
            completer = Completer(ctx.service, interval=settings.completer_interval)
            app.state.completer = completer
            tasks.append(asyncio.create_task(completer.run_forever(), name="completer"))
        if settings.advice_enabled:
            advices = AdviceWorker(
                ctx.engine,
                ctx.acquirer.advise,
                interval=settings.advice_interval,
                observe=ctx.acquirer.observe,
                attempt_s=settings.acquirer_timeout + 5.0,
            )
            app.state.advices = advices
            tasks.append(asyncio.create_task(advices.run_forever(), name="advices"))
        tasks.append(asyncio.create_task(_purge_forever(ctx), name="retention"))
        tasks.append(asyncio.create_task(ctx.waiters.run_forever(), name="waiters"))
        _close_waiters_on_exit_signal(ctx.waiters)
        interpreter = (gc.get_threshold(), sys.getswitchinterval())
        frozen = settle_heap(settings)
        try:
            yield
        finally:
            if frozen:
                gc.unfreeze()
            gc.set_threshold(*interpreter[0])  # as before the start (a test process goes on)
            sys.setswitchinterval(interpreter[1])
            ctx.waiters.close()
            # the 0200s still out end first (answered, or settled in doubt with an advice)
            await ctx.service.drain(min(settings.acquirer_timeout + 1.0, 5.0))
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await ctx.events.close(events)  # finishes the flush under way, then drains
            await ctx.close()

    app = FastAPI(
        title="idempay",
        version="1.0.0",
        summary="Exactly-once card transactions for payment terminals on unreliable links.",
        description=API_DESCRIPTION,
        lifespan=lifespan,
        docs_url=None,  # mount_docs serves /docs from the app's own assets
        redoc_url=None,
        # No OpenTelemetry here (metrics are Prometheus'): FastAPI's native telemetry would
        # otherwise look up the global OTel providers on every request (issue 13, phase 3).
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    mount_docs(app)
    # Outermost last: the request id is bound first, so a 408 carries X-Request-Id too.
    app.add_middleware(CreateRoute)  # innermost: the create's lean route (lean.py)
    app.add_middleware(BodyDeadlineMiddleware, timeout=settings.body_timeout, limit=MAX_BODY_BYTES)
    app.add_middleware(RequestIdMiddleware)
    app.include_router(ops_router)
    app.include_router(transactions_router)
    _install_error_handlers(app, settings)
    _install_openapi(app)
    return app


def _install_error_handlers(app: FastAPI, settings: Settings) -> None:
    """The app's exception handlers render through ``api.errors.problem_response``, as the
    transaction routes do (``router._Call``): one rendering, Retry-After from settings."""

    def render(error: ApiError) -> Response:
        return problem_response(error, retry_after_seconds=settings.retry_after_seconds)

    @app.exception_handler(ApiError)
    async def on_api_error(_request: Request, exc: ApiError) -> Response:
        return render(exc)

    @app.exception_handler(RequestValidationError)
    async def on_validation(_request: Request, exc: RequestValidationError) -> Response:
        errors = [
            {"loc": list(err.get("loc", [])), "msg": err.get("msg", ""), "type": err.get("type")}
            for err in exc.errors()
        ]
        return render(ValidationFailedError("The request is invalid.", extra={"errors": errors}))

    @app.exception_handler(StarletteHTTPException)
    async def on_http(_request: Request, exc: StarletteHTTPException) -> Response:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return render(
            ApiError(exc.status_code, code, str(exc.detail), headers=dict(exc.headers or {}))
        )

    @app.exception_handler(Exception)
    async def on_unexpected(_request: Request, exc: Exception) -> Response:
        error = unexpected(
            exc,
            unavailable="Storage unavailable; nothing was processed.",
            internal="Internal error.",
        )
        if error.status == 500:
            log.exception("unhandled_error", error=type(exc).__name__)
        return render(error)


API_DESCRIPTION = """\
A terminal mints a UUID per payment and sends it as `Idempotency-Key` with every attempt of
that payment; the server processes each key at most once and answers a retry with the stored
result. A lost answer is resolved by looking the key up (or fencing it with an abort), never
by minting a new key.

- **Authentication:** `Authorization: Bearer <api_key>` on every `/v1/transactions`
  operation (the *Authorize* button). A key belongs to one merchant; idempotency keys are
  scoped to it.
- **Money:** `amount` is an integer in minor units of `currency` (1250 BRL is R$ 12.50).
- **Errors:** RFC 9457 `application/problem+json` with a stable `code`; a 5xx never stores
  anything under the key, so retrying with the same key is safe.
- **Every answer** carries `X-Request-Id`; create, lookup and abort carry
  `Idempotency-Status`.
"""


def _install_openapi(app: FastAPI) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            from fastapi.openapi.utils import get_openapi

            schema = get_openapi(
                title=app.title,
                version=app.version,
                summary=app.summary,
                description=app.description,
                routes=app.routes,
            )
            add_component_schemas(schema)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def app_factory() -> FastAPI:
    """Entry point for ``uvicorn --factory api.main:app_factory`` (reads IDEMPAY_* once)."""
    return create_app(Settings())
