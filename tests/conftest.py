"""Shared fixtures: one private Postgres database per test run (dropped at the end), an
embedded SQLite directory, and real idempay servers on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.backend import Backend
from tests.support.services import create_database, drop_database, pg_url


@pytest.fixture(scope="session")
def pg_backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    name = create_database()
    backend = Backend("postgres", pg_url(name), tmp_path_factory.mktemp("pg"))
    backend.migrate()
    try:
        yield backend
    finally:
        backend.stop_all()
        drop_database(name)


@pytest.fixture(scope="session")
def sqlite_backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    backend = Backend("sqlite", None, tmp_path_factory.mktemp("sqlite"))
    backend.migrate()
    try:
        yield backend
    finally:
        backend.stop_all()


def _private(kind: str, tmp: Path) -> Iterator[Backend]:
    name = create_database() if kind == "postgres" else None
    backend = Backend(kind, pg_url(name) if name else None, tmp)
    backend.migrate()
    try:
        yield backend
    finally:
        backend.stop_all()
        if name:
            drop_database(name)


@pytest.fixture(params=["postgres", "sqlite"])
def private_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """A database of this test's own. The session backends are shared by every module's
    servers, and each server runs a completer that re-drives any expired lease it finds with
    its own settings: a test that changes the issuer's timings, or counts keys left stuck,
    must not share its database with them."""
    yield from _private(request.param, tmp_path)


@pytest.fixture
def private_pg_backend(tmp_path: Path) -> Iterator[Backend]:
    """``private_backend`` on Postgres only."""
    yield from _private("postgres", tmp_path)


@pytest.fixture(scope="session", params=["postgres", "sqlite"])
def backend(request: pytest.FixtureRequest) -> Backend:
    """The contract suite runs on both storage backends."""
    fixture = "pg_backend" if request.param == "postgres" else "sqlite_backend"
    return request.getfixturevalue(fixture)  # type: ignore[no-any-return]
