"""Helpers for the security suite: servers with their own log file, and comparisons."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
import pytest

from tests.api.conftest import Deployment
from tests.support.backend import Backend
from tests.support.client import Api
from tests.support.services import Server

# Headers that differ on every response by design.
VOLATILE_HEADERS = frozenset({"date", "x-request-id"})


class _KeptClient(httpx.Client):
    """An httpx client that survives ``with``: creating one per request costs ~50 ms."""

    def __enter__(self) -> _KeptClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None = None,
        exc_value: BaseException | None = None,
        traceback: TracebackType | None = None,
    ) -> None:
        return None


@dataclass
class KeptApi(Api):
    """``Api`` over one kept connection pool (close it with ``close``)."""

    _client: _KeptClient | None = field(default=None, init=False, repr=False)

    def client(self) -> httpx.Client:
        if self._client is None:
            self._client = _KeptClient(base_url=self.base_url, timeout=30.0)
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


def kept(api: Api) -> KeptApi:
    return KeptApi(api.base_url, api.api_key)


@pytest.fixture
def api(deployment: Deployment) -> Iterator[KeptApi]:
    """Merchant A of the session's deployment, over one kept connection pool."""
    client = kept(deployment.a)
    try:
        yield client
    finally:
        client.close()


def stable_headers(response: httpx.Response) -> dict[str, str]:
    return {k: v for k, v in response.headers.items() if k not in VOLATILE_HEADERS}


def log_records(path: Path) -> list[dict[str, Any]]:
    """Every line of a server log as a JSON object; fails on any line that is not one."""
    records = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        record = json.loads(line)  # raises on a forged or partial line
        assert isinstance(record, dict), (number, line)
        assert {"event", "level", "timestamp"} <= record.keys(), (number, line)
        records.append(record)
    return records


@dataclass
class Audited:
    """A server of our own on Postgres, so its log holds only this module's requests."""

    backend: Backend
    server: Server
    api: KeptApi

    @property
    def log(self) -> Path:
        return self.server.log_path


@pytest.fixture(scope="module")
def audited(pg_backend: Backend, request: pytest.FixtureRequest) -> Iterator[Audited]:
    overrides: dict[str, str] = getattr(request.module, "SERVER_ENV", {})
    server = pg_backend.server(workers=1, **overrides)
    merchant = f"merchant-{request.module.__name__.rsplit('.', 1)[-1]}"
    api = KeptApi(server.url, pg_backend.api_key(merchant))
    try:
        yield Audited(pg_backend, server, api)
    finally:
        api.close()
        server.stop()
