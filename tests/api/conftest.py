from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.backend import Backend
from tests.support.client import Api
from tests.support.services import RedisServer, Server


@dataclass
class Deployment:
    backend: Backend
    server: Server
    a: Api  # merchant A
    b: Api  # merchant B, same server

    def count(self, table: str, **where: str) -> int:
        clause = " AND ".join(f"{col} = :{col}" for col in where) or "1=1"
        rows = self.backend.sql(f'SELECT count(*) FROM "{table}" WHERE {clause}', **where)
        return int(rows[0][0])


@pytest.fixture(scope="session")
def deployment(backend: Backend) -> Deployment:
    server = backend.server()
    key_a = backend.api_key("merchant-a")
    key_b = backend.api_key("merchant-b")
    return Deployment(backend, server, Api(server.url, key_a), Api(server.url, key_b))


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of this test's own, so it can be killed and flushed freely."""
    server = RedisServer(tmp_path).start()
    try:
        yield server
    finally:
        server.kill()
