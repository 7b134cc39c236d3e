"""A PostgreSQL cluster of the test's own, for tests that crash, stop or reconfigure it, with a
migrated ``Backend`` on it (tests/api/transactions/test_postgres_crash_mid_create.py,
test_unknown_outcome_cluster.py)."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from idempay_tools.private_services import PrivatePostgres
from tests.support.backend import Backend


@contextlib.contextmanager
def private_cluster(prefix: str, tmp_path: Path) -> Iterator[tuple[PrivatePostgres, Backend]]:
    """The cluster started and a Backend on it migrated; after: the backend's servers stopped,
    the cluster stopped, its files removed.

    The cluster lives outside pytest's base temp dir: another pytest session on the machine
    sets that back to 0700, and the postgres user then cannot reopen its files on recovery."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    root.chmod(0o711)
    pg = PrivatePostgres(root).init()
    pg.start()
    backend = Backend("postgres", pg.url, tmp_path)
    try:
        backend.migrate()
        yield pg, backend
    finally:
        backend.stop_all()
        pg.stop()
        shutil.rmtree(root, ignore_errors=True)
