"""``POST /v1/transactions`` without FastAPI's routing and dependency solving.

The create is the hot path: FastAPI's per-request work for it — matching the route list,
solving the three ``Header`` parameters through pydantic, the exception-handling wrappers and
their exit stacks — cost about a third of the HTTP layer (docs/benchmarks.md). The handler
(``router.handle_create``) reads its headers itself and catches every error into an answer,
so this ASGI middleware, innermost of the app's middlewares (inside the request id and the
body deadline), hands it the request directly. Everything else — including the other methods
and a trailing slash on this path — goes to FastAPI as before; the FastAPI route stays for
the OpenAPI document and calls the same handler.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from api.transactions.router import handle_create

PATH = "/v1/transactions"


class CreateRoute:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == PATH and scope["method"] == "POST":
            response = await handle_create(Request(scope, receive))
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)
