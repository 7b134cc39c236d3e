"""The app in the test's own process, as uvicorn would run it (lifespan included), and an
httpx client that calls it over ASGI: the fast lane's way to send real HTTP requests
without a server process (tests/api/test_router_asgi.py, tests/api/guard)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import httpx
from fastapi import FastAPI

from api.config import Settings
from api.main import create_app

BASE_URL = "http://idempay.test"


@contextlib.asynccontextmanager
async def running_app(settings: Settings) -> AsyncIterator[FastAPI]:
    """The app with its lifespan running (pools, writers, completer as configured)."""
    application = create_app(settings)
    async with application.router.lifespan_context(application):
        yield application


@contextlib.asynccontextmanager
async def asgi_client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url=BASE_URL) as client:
        yield client
