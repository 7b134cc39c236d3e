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


@pytest.fixture
def private_sqlite_backend(tmp_path: Path) -> Iterator[Backend]:
    """``private_backend`` on the embedded SQLite only."""
    yield from _private("sqlite", tmp_path)


@pytest.fixture(scope="session", params=["postgres", "sqlite"])
def backend(request: pytest.FixtureRequest) -> Backend:
    """The contract suite runs on both storage backends."""
    fixture = "pg_backend" if request.param == "postgres" else "sqlite_backend"
    return request.getfixturevalue(fixture)  # type: ignore[no-any-return]


# The fast lane (`make test-fast`) leaves out the kinds of test that start processes or
# engines; `make test` runs everything. Kinds are read off the fixtures a test uses (the
# closure, so a fixture built on a backend counts) and, for whole-harness files, its path.
_KIND_FIXTURES = {
    "server": {
        "pg_backend",
        "sqlite_backend",
        "private_backend",
        "private_pg_backend",
        "private_sqlite_backend",
        "backend",
        "deployed_db",
        "database",
    },
    "redis": {"redis_server", "private_redis", "shared_redis", "redis_env", "redis_prefix"},
    "spark": {"spark", "lake", "audited"},
    "browser": {"chromium"},
}
_KIND_PATHS = {
    "model": ("tests/test_protocol_model.py",),
    "chaos": (
        "tests/loadtest/",
        "tests/idempay_tools/test_chaos",  # test_chaos.py, test_chaos_proxy.py
        "tests/idempay_tools/test_simulate_cli.py",
        "tests/idempay_tools/test_failover.py",  # etcd + Patroni + two PostgreSQL nodes
    ),
    "spark": ("tests/analytics/", "tests/deploy/test_audit_as_scheduled.py"),
    "server": ("tests/deploy/", "tests/client_sdk/test_integration_", "tests/api/fuzz/"),
}


def pytest_configure(config: pytest.Config) -> None:
    for kind in ("server", "redis", "spark", "browser", "model", "chaos"):
        config.addinivalue_line("markers", f"{kind}: needs {kind} (left out of make test-fast)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = Path(str(config.rootpath))
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        path = Path(str(item.path)).relative_to(root).as_posix()
        for kind, names in _KIND_FIXTURES.items():
            if used & names:
                item.add_marker(kind)
        for kind, prefixes in _KIND_PATHS.items():
            if path.startswith(prefixes):
                item.add_marker(kind)
