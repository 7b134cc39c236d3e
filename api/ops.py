"""Operations endpoints: liveness, readiness, Prometheus metrics, the retention policy."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from prometheus_client import CONTENT_TYPE_LATEST
from sqlalchemy import text
from starlette.responses import JSONResponse, Response

from api.db import disk_refuses_writes
from api.errors import PROBLEM_JSON
from api.metrics import exposition

router = APIRouter(tags=["operations"])


@router.get(
    "/healthz",
    summary="Liveness",
    description="The process is alive (no storage is asked). Terminals may read the server's "
    "clock off this answer's `Date` header; it is never cached.",
    operation_id="healthz",
)
async def healthz(response: Response) -> dict[str, str]:
    # Terminals read the server's clock off this answer's Date (their first-payment clock
    # check): a cache must never hand them a stale one.
    response.headers["Cache-Control"] = "no-store"
    return {"status": "ok"}


_READY_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "Storage reachable (status ok; degraded when Redis is down, or when the"
        " embedded SQLite's disk is full: checks.disk `full`, creates refused, reads answered)"
    },
    503: {
        "description": "Storage unreachable",
        "content": {"application/problem+json": {"schema": {"type": "object"}}},
    },
}
_METRICS_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "Prometheus text exposition",
        "content": {CONTENT_TYPE_LATEST.split(";")[0]: {"schema": {"type": "string"}}},
    }
}


@router.get(
    "/readyz",
    responses=_READY_RESPONSES,
    summary="Readiness",
    description="The database is reachable (200); Redis being out is reported as `degraded`, "
    "not down, and so is the embedded SQLite's full disk (`checks.disk`: `full`: new creates "
    "are refused, replays and lookups answered). 503 when the database cannot be reached.",
    operation_id="readyz",
)
async def readyz(request: Request) -> Response:
    ctx = request.app.state.ctx
    database = "ok"
    try:
        async with asyncio.timeout(2.0), ctx.engine.connect() as conn:
            # a read (a plain BEGIN on SQLite): a full disk refuses writes, not reads
            await conn.execution_options(sqlite_deferred_begin=True)
            await conn.execute(text("SELECT 1"))
    except Exception:
        database = "down"
    redis = "disabled"
    if ctx.redis is not None:
        try:
            async with asyncio.timeout(1.0):
                await ctx.redis.ping()
            redis = "ok"
        except Exception:
            redis = "down"
    checks = {"database": database, "redis": redis}
    if database == "ok" and disk_refuses_writes(ctx.engine):
        checks["disk"] = "full"  # new creates are refused (503); replays and lookups answered
    if database != "ok":
        body: dict[str, Any] = {
            "type": "urn:idempay:problem:service_unavailable",
            "title": "Storage unavailable",
            "status": 503,
            "detail": "The database is unreachable.",
            "code": "service_unavailable",
            "checks": checks,
        }
        return JSONResponse(body, 503, media_type=PROBLEM_JSON, headers={"Retry-After": "1"})
    status = "degraded" if redis == "down" or "disk" in checks else "ok"
    return JSONResponse({"status": status, "checks": checks})


@router.get(
    "/metrics",
    response_class=Response,
    responses=_METRICS_RESPONSES,
    summary="Prometheus metrics",
    operation_id="metrics",
)
async def metrics(request: Request) -> Response:
    return Response(exposition(), media_type=CONTENT_TYPE_LATEST)


@router.get(
    "/v1/idempotency-policy",
    summary="Retention policy",
    operation_id="idempotencyPolicy",
)
async def idempotency_policy(request: Request) -> dict[str, Any]:
    """How long keys, tombstones and responses are kept (also in the README)."""
    settings = request.app.state.ctx.settings
    retention = settings.tombstone_retention
    return {
        "key_scope": "merchant",
        "completed_keys": {
            "retention": "permanent",
            "detail": "A processed key lives as long as its transaction (a financial record); "
            "its stored response is replayed for the same payload forever.",
        },
        "tombstone_retention_seconds": retention,
        "request_event_retention_seconds": retention,
        "captured_at_max_age_seconds": retention,
        "clock_skew_tolerance_seconds": settings.clock_skew_tolerance,
        "tombstone_min_age_seconds": retention + settings.clock_skew_tolerance,
        "response_retention": "permanent (stored with the key)",
        "lease_seconds": settings.lease_seconds,
        "answer_within_seconds": settings.answer_within,
        "acquirer_timeout_seconds": settings.acquirer_timeout,
        "rule": "A create whose captured_at (or UUIDv7 key time) is older than the tombstone "
        "retention window is refused (410 request_expired), one further ahead of the server's "
        "clock than the tolerance is refused (422 clock_skew), and tombstones are kept at least "
        "retention + tolerance, so no late original can outlive its tombstone.",
    }
