"""Shared fixtures: one private Postgres database per test run (dropped at the end), an
embedded SQLite directory, and real idempay servers on 127.0.0.1."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.backend import Backend
from tests.support.citus import CitusCluster
from tests.support.jvm import SHORT_LIVED_JVM
from tests.support.services import create_database, drop_database, pg_url

pytest_plugins = ("tests.support.cpu_report",)  # the heaviest tests by CPU, in every run

# Every driver JVM the suite starts through Spark's launcher — the CLI's audit, spark-submit,
# the demo's audit, the analytics session — runs with a JIT and collector for a short life
# (tests.support.jvm). Spark reads SPARK_SUBMIT_OPTS into the driver's command line without a
# word on stderr, unlike JDK_JAVA_OPTIONS. The deployment test's Spark container keeps the
# defaults.
os.environ.setdefault("SPARK_SUBMIT_OPTS", SHORT_LIVED_JVM)


@pytest.fixture(scope="session")
def citus() -> Iterator[CitusCluster]:
    """The private Citus cluster (a coordinator and two workers), once per run: every test
    that uses it is in one xdist group, and each module takes a database of its own on it.
    In a folder of its own under /tmp, not pytest's: the nodes run as the postgres user, and
    pytest makes its own root folder private again (0700) at every session start."""
    root = Path(tempfile.mkdtemp(prefix="idempay-citus-"))
    cluster = CitusCluster(root)
    try:
        yield cluster.start()
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


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
        "tests/idempay_tools/test_failover",  # etcd + Patroni + two PostgreSQL nodes
    ),
    "spark": ("tests/analytics/", "tests/deploy/test_audit_as_scheduled.py"),
    "server": ("tests/deploy/", "tests/client_sdk/test_integration_", "tests/api/fuzz/"),
}


# `make test` runs the suite on pytest-xdist workers with `--dist loadgroup`: tests that share
# something costly a worker holds for the session stay on one worker (an `xdist_group`), so it
# starts once per run: the private Citus cluster, the SparkSession. Everything a worker makes
# on the machine's shared services is named for that worker (tests.support.services).
_GROUP_FIXTURES = {
    "citus": {"citus"},  # tests/conftest.py's session cluster
    "spark": {"spark"},  # tests/analytics/conftest.py's SparkSession
}


class _GroupsInNodeIds:
    """``--dist loadgroup`` sends together the tests whose node ids end in the same
    ``@group``: pytest-xdist's worker appends it by setting ``item._nodeid``, which pytest
    9.2 no longer reads (node ids became structured), so no test was grouped. This does the
    same on the structured id, after every other plugin, where xdist did not."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(
        self, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        if not config.getvalue("loadgroup"):
            return
        for item in items:
            names = {
                str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
                for mark in item.iter_markers("xdist_group")
            }
            if not names or "@" in item.nodeid:
                continue
            grouped = f"{item.nodeid}@{'_'.join(sorted(names))}"
            if hasattr(item, "_id"):
                from _pytest.nodeid import coerce_node_id  # type: ignore[import-not-found]

                item._id = coerce_node_id(grouped)
            else:
                item._nodeid = grouped


def pytest_configure(config: pytest.Config) -> None:
    for kind in ("server", "redis", "spark", "browser", "model", "chaos"):
        config.addinivalue_line("markers", f"{kind}: needs {kind} (left out of make test-fast)")
    if getattr(config, "workerinput", None) is not None:  # a pytest-xdist worker
        config.pluginmanager.register(_GroupsInNodeIds(), "idempay-xdist-groups")


@pytest.hookimpl(tryfirst=True)  # before xdist's worker reads the groups off the items
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
        for group, names in _GROUP_FIXTURES.items():
            if used & names:
                item.add_marker(pytest.mark.xdist_group(group))
    if getattr(config, "workerinput", None) is not None:
        _longest_first(items)


# Kinds whose tests run for minutes each (the model's verification, the chaos and failover
# harnesses) or in one long group on one worker (Citus, Spark).
_LONG_KINDS = ("model", "chaos", "spark", "citus", "xdist_group")


def _longest_first(items: list[pytest.Item]) -> None:
    """Under xdist, the modules holding long tests are handed out first: the workers are
    given work in collection order, and the model's verification, collected last, ran alone
    at the end of the run while the other workers idled. Whole modules move (a module's
    fixtures are set up once); the order is otherwise kept, and is the same in every worker."""
    long = {item.path for item in items if any(item.get_closest_marker(k) for k in _LONG_KINDS)}
    items.sort(key=lambda item: item.path not in long)
