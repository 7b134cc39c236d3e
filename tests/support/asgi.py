"""The app in the test's own process, as uvicorn would run it (lifespan included), and an
httpx client that calls it over ASGI: the fast lane's way to send real HTTP requests
without a server process (tests/api/test_router_asgi.py, tests/api/guard).

A module gets the ``app`` and ``http`` fixtures by importing them from here and defining an
``asgi_settings`` fixture (module scope) for the app's settings."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from api.config import Settings
from api.main import create_app
from api.migrate import migrate

BASE_URL = "http://idempay.test"
# Rate limits out of the way of a module that sends many requests (some without a key).
UNLIMITED: dict[str, Any] = {
    "rate_limit": "100000/second",
    "rate_limit_terminal": "100000/second",
    "auth_failure_limit": "100000/minute",
}


def migrated_sqlite(var: Path) -> Settings:
    """A migrated SQLite file in ``var``; Redis off (it is advisory), no completer (nothing
    leaves a key processing), rate limits ``UNLIMITED``. Migrated here: ``migrate`` runs
    its own event loops, before the app's."""
    settings = Settings(
        database_url=None, var_dir=var, redis_url=None, completer_enabled=False, **UNLIMITED
    )
    migrate(settings)
    return settings


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


@pytest.fixture(scope="module")
async def app(asgi_settings: Settings) -> AsyncIterator[FastAPI]:
    """The app on the module's ``asgi_settings``, its lifespan running for the module."""
    async with running_app(asgi_settings) as application:
        yield application


@pytest.fixture(scope="module")
async def http(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """An httpx client that calls ``app`` over ASGI."""
    async with asgi_client(app) as client:
        yield client
