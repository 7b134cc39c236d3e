"""A storage backend under test (Postgres or the embedded SQLite) and servers on it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from api.auth import create_api_key
from api.config import Settings
from api.db import create_engine
from api.migrate import migrate
from tests.support.services import Server

# Fast issuer timings so every path of contract §2 is reachable in seconds.
FAST_ENV = {
    "IDEMPAY_ANSWER_WITHIN": "1.5",
    "IDEMPAY_ACQUIRER_SLOW_SECONDS": "0.8",
    "IDEMPAY_ACQUIRER_TIMEOUT": "3",
    "IDEMPAY_ISSUER_DEADLINE": "6",
    "IDEMPAY_LEASE_SECONDS": "3",
    "IDEMPAY_COMPLETER_INTERVAL": "0.3",
    "IDEMPAY_RATE_LIMIT": "100000/second",
    "IDEMPAY_RATE_LIMIT_TERMINAL": "100000/second",
    "IDEMPAY_AUTH_FAILURE_LIMIT": "100000/minute",  # tests/api/security sets a low one
    "IDEMPAY_EVENT_FLUSH_INTERVAL": "0.05",
    "IDEMPAY_DB_POOL_SIZE": "6",  # Postgres is shared (max_connections 100) by 4 test workers
}


@dataclass
class Backend:
    name: str
    database_url: str | None
    tmp: Path
    servers: list[Server] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        env = {"IDEMPAY_VAR_DIR": str(self.tmp / "var"), "IDEMPAY_REDIS_URL": ""}
        if self.database_url:
            env["IDEMPAY_DATABASE_URL"] = self.database_url
        return env

    @property
    def settings(self) -> Settings:
        return Settings(database_url=self.database_url or None, var_dir=self.tmp / "var")

    @property
    def url(self) -> str:
        return self.settings.resolved_database_url

    def migrate(self) -> None:
        migrate(self.settings)

    def server(self, *, workers: int = 1, **overrides: str) -> Server:
        env = {**self.env, **FAST_ENV, **overrides}
        log = self.tmp / f"server-{len(self.servers)}.log"
        server = Server(env, log, workers=workers).start()
        self.servers.append(server)
        return server

    def api_key(self, merchant: str) -> str:
        async def run() -> str:
            engine = create_engine(self.settings)
            try:
                return await create_api_key(engine, merchant)
            finally:
                await engine.dispose()

        return asyncio.run(run())

    def sql(self, statement: str, **params: Any) -> list[Any]:
        async def run() -> list[Any]:
            engine = create_async_engine(self.url, poolclass=NullPool)
            try:
                async with engine.begin() as conn:
                    result = await conn.execute(text(statement), params)
                    return list(result.fetchall()) if result.returns_rows else []
            finally:
                await engine.dispose()

        return asyncio.run(run())

    def stop_all(self) -> None:
        for server in self.servers:
            server.stop()
