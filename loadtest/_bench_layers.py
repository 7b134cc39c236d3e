"""``--profile``: py-spy's samples of the create server filed by layer.

Each sampled stack goes to one layer: the frames are read from the leaf towards the root and
the first frame that names a layer decides (a ``json.dumps`` leaf called from
``repository.render`` is "service"; a ``sqlalchemy`` leaf is "SQL"). A stack with any frame
of ``api/events/`` is "request events" first. SQLAlchemy's async engine runs in greenlets
whose stacks py-spy shows without the awaiting coroutine, so SQL issued by the
request-events flush lands in "SQL" (a batch per 100 events: small).

Layers: ASGI/HTTP (uvicorn, httptools, Starlette, FastAPI, idempay's middlewares, the lean
create route and the error answers), auth, rate limit, validation (body reading, JSON
decode, PAN scan, sale rules, pydantic, headers), fingerprint (canonical body + sha256),
acquirer link (``api/acquirer/``: the 0200 built, framed, written and its answer read;
pyiso8583), SQL (SQLAlchemy, asyncpg, aiosqlite/sqlite3, ``api/db.py``, the key store, the
group commit, the hot path's prepared reads, the transaction and outbox inserts), service
(the create's phases, transaction and response rendering, the rest of ``api/transactions/``
and ``api/idempotency/``), metrics (prometheus_client), logs (structlog, logging), request
events, event loop / other (asyncio, uvloop, native frames).
"""

from __future__ import annotations

LAYERS = (
    "ASGI/HTTP",
    "auth",
    "rate limit",
    "validation",
    "fingerprint",
    "acquirer link",
    "SQL",
    "service",
    "metrics",
    "logs",
    "request events",
    "event loop / other",
)

# (substring of "function (path)", layer), tried in order against each frame, leaf first.
_MARKERS: tuple[tuple[str, str], ...] = (
    ("Runner.run (", "event loop / other"),  # uvloop's own time: the loop is native code
    ("prometheus_client/", "metrics"),
    ("api/metrics.py", "metrics"),
    ("structlog/", "logs"),
    ("stdlib/logging/", "logs"),
    ("api/logs.py", "logs"),
    ("body_fingerprint", "fingerprint"),
    ("fingerprint (api/idempotency/keys.py", "fingerprint"),
    ("api/ratelimit.py", "rate limit"),
    ("limits/", "rate limit"),
    ("api/auth.py", "auth"),
    ("api/acquirer/", "acquirer link"),
    ("iso8583/", "acquirer link"),
    ("sqlalchemy", "SQL"),
    ("asyncpg/", "SQL"),
    ("aiosqlite/", "SQL"),
    ("stdlib/sqlite3/", "SQL"),
    ("greenlet", "SQL"),
    ("api/db.py", "SQL"),
    ("api/idempotency/store.py", "SQL"),
    ("api/transactions/group_commit.py", "SQL"),
    ("api/transactions/pg_create.py", "SQL"),
    ("api/transactions/sqlite_create.py", "SQL"),
    ("api/transactions/inline.py", "SQL"),
    ("insert_transaction (api/transactions/repository.py", "SQL"),
    ("append (api/outbox/writer.py", "SQL"),
    ("api/transactions/http.py", "validation"),
    ("api/pan.py", "validation"),
    ("api/transactions/schemas.py", "validation"),
    ("api/sale_rules.py", "validation"),
    ("api/headers.py", "validation"),
    ("parse_key (api/idempotency/keys.py", "validation"),
    ("pydantic", "validation"),
    ("api/transactions/router.py", "ASGI/HTTP"),
    ("api/transactions/lean.py", "ASGI/HTTP"),
    ("api/transactions/", "service"),
    ("api/idempotency/", "service"),
    ("api/outbox/", "service"),
    ("api/bench_baseline.py", "service"),
    ("uvicorn/", "ASGI/HTTP"),
    ("starlette/", "ASGI/HTTP"),
    ("fastapi/", "ASGI/HTTP"),
    ("httptools", "ASGI/HTTP"),
    ("api/http_limits.py", "ASGI/HTTP"),
    ("api/main.py", "ASGI/HTTP"),
    ("api/errors.py", "ASGI/HTTP"),
)


def layer_of(frames: list[str]) -> str:
    """The layer of one stack (``frames`` root first, each ``function (short/path.py)``)."""
    if any("api/events/" in frame for frame in frames):
        return "request events"
    for frame in reversed(frames):
        for marker, layer in _MARKERS:
            if marker in frame:
                return layer
    return "event loop / other"
