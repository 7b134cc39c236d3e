"""A real server per test module with short slow-client timeouts, its merchant, and the
server's own OpenAPI schemas (to validate 2xx bodies)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.api.fuzz.contract import Schemas, load_schemas, merchant_id
from tests.support.backend import Backend
from tests.support.client import Api
from tests.support.services import Server

# Seconds, so a slow client is timed out in a test in seconds (defaults: 10 s each).
SHORT_TIMEOUTS = {"IDEMPAY_HEADER_TIMEOUT": "1.5", "IDEMPAY_BODY_TIMEOUT": "1.5"}


@dataclass
class Target:
    backend: Backend
    server: Server
    api: Api
    merchant: str
    schemas: Schemas

    @property
    def host_port(self) -> tuple[str, int]:
        return "127.0.0.1", self.server.port

    def log_text(self) -> str:
        return self.server.log_path.read_text(errors="replace")


def _target(backend: Backend, request: pytest.FixtureRequest) -> Iterator[Target]:
    server = backend.server(**SHORT_TIMEOUTS)
    name = f"merchant-{request.module.__name__.rsplit('.', 1)[-1]}-{backend.name}"
    api_key = backend.api_key(name)
    try:
        yield Target(
            backend,
            server,
            Api(server.url, api_key),
            merchant_id(backend, api_key),
            load_schemas(server),
        )
    finally:
        server.stop()


@pytest.fixture(scope="module")
def pg_target(pg_backend: Backend, request: pytest.FixtureRequest) -> Iterator[Target]:
    yield from _target(pg_backend, request)


@pytest.fixture(scope="module")
def sqlite_target(sqlite_backend: Backend, request: pytest.FixtureRequest) -> Iterator[Target]:
    yield from _target(sqlite_backend, request)
