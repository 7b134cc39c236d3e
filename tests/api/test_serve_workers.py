"""Goal 5 of issue 13: ``idempay serve`` uses the machine's cores by default on Postgres,
within a connection budget, and one worker on the embedded SQLite (one writer per file)."""

from __future__ import annotations

import os

import pytest

from api.cli import DEFAULT_CONNECTION_BUDGET, default_workers
from api.config import Settings

PG = "postgresql+asyncpg://postgres@127.0.0.1:5432/x"


def _cores(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(n)), raising=False)


def test_one_worker_per_core_on_postgres(monkeypatch: pytest.MonkeyPatch) -> None:
    _cores(monkeypatch, 2)
    assert default_workers(Settings(database_url=PG, db_pool_size=30)) == 2


def test_workers_stay_within_the_connection_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    _cores(monkeypatch, 64)
    workers = default_workers(Settings(database_url=PG, db_pool_size=30))
    assert workers == DEFAULT_CONNECTION_BUDGET // 30
    assert default_workers(Settings(database_url=PG, db_pool_size=5)) == 18


def test_one_worker_on_the_embedded_sqlite(monkeypatch: pytest.MonkeyPatch) -> None:
    _cores(monkeypatch, 8)
    assert default_workers(Settings(database_url=None)) == 1
