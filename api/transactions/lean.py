"""``POST /v1/transactions`` and ``GET /v1/transactions/{id}`` without FastAPI's routing
and dependency solving.

The create is the hot path: FastAPI's per-request work for it — matching the route list,
solving the three ``Header`` parameters through pydantic, the exception-handling wrappers and
their exit stacks — cost about a third of the HTTP layer (docs/benchmarks.md). The handler
(``router.handle_create``) reads its headers itself and catches every error into an answer,
so this ASGI middleware, innermost of the app's middlewares (inside the request id and the
body deadline), hands it the request directly; a lookup (``router.handle_lookup``) likewise,
with the id taken from the path as FastAPI's ``{transaction_id}`` would (one non-empty
segment). Everything else — other methods, a trailing slash, abort and reversal — goes to
FastAPI as before; the FastAPI routes stay for the OpenAPI document and call the same
handlers.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from api.transactions.router import handle_create, handle_lookup

PATH = "/v1/transactions"
PREFIX = PATH + "/"


class CreateRoute:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path, method = scope["path"], scope["method"]
            if path == PATH and method == "POST":
                response = await handle_create(Request(scope, receive))
                await response(scope, receive, send)
                return
            key = path[len(PREFIX) :] if path.startswith(PREFIX) else ""
            if key and "/" not in key and method == "GET":
                response = await handle_lookup(Request(scope, receive), key)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
