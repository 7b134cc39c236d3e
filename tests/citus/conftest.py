"""The Citus suite (issue 18): idempay on a private coordinator + 2 workers.

Every test here is marked ``citus`` and ``server`` (it starts processes), so ``make test``
runs it and ``make test-fast`` leaves it out. The cluster (``citus``, tests/conftest.py)
starts once per run (``scripts/citus.sh`` builds and installs the extension first on a
fresh machine); each module takes a database of its own on it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.backend import Backend
from tests.support.citus import BUILD_TIMEOUT, CitusCluster

HERE = Path(__file__).resolve().parent


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "citus: needs the private Citus cluster (scripts/citus.sh)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.path)).resolve().parents:
            item.add_marker("citus")
            item.add_marker("server")
            # The first test sets the cluster up, which on a fresh machine builds Citus.
            item.add_marker(pytest.mark.timeout(BUILD_TIMEOUT))


def citus_backend(cluster: CitusCluster, tmp: Path) -> Backend:
    """A new database on the cluster, migrated (and so distributed), as a test backend."""
    backend = Backend("citus", cluster.url(cluster.database()), tmp)
    backend.migrate()
    return backend


@pytest.fixture(scope="module")
def citus_db(citus: CitusCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    backend = citus_backend(citus, tmp_path_factory.mktemp("citus-db"))
    try:
        yield backend
    finally:
        backend.stop_all()
