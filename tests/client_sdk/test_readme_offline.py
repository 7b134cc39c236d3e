"""The README's "Selling with the link down" runs as written: first with the server out of
reach (the sale is stored offline), then, rebooted with the link back, ``recover()``
forwards it and the next sale goes online — one transaction each, the first one offline."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

from integration_db import Merchant, journal_entries
from test_readme_terminal import README, first_python_block

from client_sdk import JournalState
from idempay_tools.serve_process import free_port
from tests.support.backend import Backend

HEADING = "## Selling with the link down (store and forward)"


def _run(snippet: str, url: str, api_key: str, cwd: Path) -> str:
    env = {**os.environ, "IDEMPAY_URL": url, "IDEMPAY_API_KEY": api_key}
    done = subprocess.run(
        [sys.executable, "-c", snippet], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_readme_offline_snippet_sells_offline_then_forwards(
    pg_backend: Backend, tmp_path: Path
) -> None:
    snippet = first_python_block(README.read_text(encoding="utf-8"), HEADING)
    merchant = Merchant.create(pg_backend, f"readme-offline-{uuid.uuid4().hex[:8]}")
    dead = f"http://127.0.0.1:{free_port()}"
    assert _run(snippet, dead, merchant.api_key, tmp_path) == "offline approved\n"
    [stored] = journal_entries(tmp_path / "pos.db")
    assert stored.state is JournalState.STORED and merchant.transactions() == {}
    server = pg_backend.server()
    try:
        assert _run(snippet, server.url, merchant.api_key, tmp_path) == "online approved\n"
    finally:
        server.stop()
    entries = journal_entries(tmp_path / "pos.db")
    assert [e.state for e in entries] == [JournalState.RESOLVED] * 2
    assert merchant.transactions() == {e.key: "approved" for e in entries}
    [(offline,)] = pg_backend.sql('SELECT offline FROM "transaction" WHERE id = :k', k=stored.key)
    assert bool(offline)
