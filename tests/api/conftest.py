from __future__ import annotations

from dataclasses import dataclass

import pytest

from tests.support.backend import Backend
from tests.support.client import Api
from tests.support.services import Server


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
