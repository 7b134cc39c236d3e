"""py-spy stacks of the create path filed by layer (issue 13's CPU-per-layer table).

Each sampled stack goes to one layer: the frames are read from the leaf towards the root and
the first frame that names a layer decides (a ``json.dumps`` leaf called from
``repository.render`` is "response and rows (service)"; a ``sqlalchemy`` leaf is "SQL").
A stack with any frame of ``api/events/`` is "request events" first. SQLAlchemy's async
engine runs in greenlets whose stacks py-spy shows without the awaiting coroutine, so SQL
issued by the request-events flush lands in "SQL" (a batch per 100 events: small).

Layers: ASGI/HTTP (uvicorn, httptools, Starlette, FastAPI routing, idempay's middlewares and
the router's response), auth, rate limit, validation (JSON decode, PAN scan, pydantic,
headers), fingerprint (canonical body + sha256), SQL (SQLAlchemy, asyncpg, aiosqlite/sqlite3,
``api/db.py``, the store/repository/outbox statements, group commit), acquirer link
(pyiso8583's encode/decode, framing, the 0200's fields, STAN matching, the reader task),
service (transaction and response rendering, hashes, the create's phases), metrics
(prometheus_client), logs (structlog, logging), request events, event loop (asyncio,
uvloop, native frames).
"""

from __future__ import annotations

from collections import Counter

LAYERS = (
    "ASGI/HTTP",
    "auth",
    "rate limit",
    "validation",
    "fingerprint",
    "SQL",
    "acquirer link",
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
    ("iso8583/", "acquirer link"),  # pyiso8583's encode/decode
    ("api/acquirer/", "acquirer link"),  # framing, the 0200's fields, STAN matching, reader
    ("api/ratelimit.py", "rate limit"),
    ("limits/", "rate limit"),
    ("api/auth.py", "auth"),
    ("sqlalchemy", "SQL"),
    ("asyncpg/", "SQL"),
    ("aiosqlite/", "SQL"),
    ("stdlib/sqlite3/", "SQL"),
    ("greenlet", "SQL"),
    ("api/db.py", "SQL"),
    ("api/idempotency/store.py", "SQL"),
    ("insert_transaction (api/transactions/repository.py", "SQL"),
    ("append (api/outbox/writer.py", "SQL"),
    ("api/transactions/group_commit.py", "SQL"),
    ("api/transactions/http.py", "validation"),
    ("api/transactions/pan.py", "validation"),
    ("api/transactions/schemas.py", "validation"),
    ("parse_key (api/idempotency/keys.py", "validation"),
    ("pydantic", "validation"),
    ("api/transactions/repository.py", "service"),
    ("api/transactions/service.py", "service"),
    ("api/transactions/acquire.py", "service"),
    ("api/transactions/unknown_outcome.py", "service"),
    ("api/transactions/waiting.py", "service"),
    ("api/transactions/outcome.py", "service"),
    ("api/idempotency/", "service"),
    ("uvicorn/", "ASGI/HTTP"),
    ("starlette/", "ASGI/HTTP"),
    ("fastapi/", "ASGI/HTTP"),
    ("httptools", "ASGI/HTTP"),
    ("api/http_limits.py", "ASGI/HTTP"),
    ("api/main.py", "ASGI/HTTP"),
    ("api/transactions/router.py", "ASGI/HTTP"),
    ("api/transactions/lean.py", "ASGI/HTTP"),
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


def by_layer(collapsed: str) -> Counter[str]:
    """Samples per layer from py-spy's ``-f raw`` output."""
    from loadtest._bench_profile import _frame

    counts: Counter[str] = Counter()
    for line in collapsed.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not count_text.isdigit():
            continue
        frames = [_frame(raw)[0] for raw in stack.split(";") if raw.strip()]
        counts[layer_of(frames)] += int(count_text)
    return counts
