"""The README's "A terminal in ten lines" runs as written against a live server (Postgres)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

from integration_db import Merchant, journal_entries

from client_sdk import JournalState
from tests.support.backend import Backend

README = Path(__file__).resolve().parents[2] / "README.md"
HEADING = "## A terminal in ten lines"


def first_python_block(markdown: str, heading: str) -> str:
    """The first ```python block between ``heading`` and the next heading of its level."""
    lines = markdown.splitlines()
    start = lines.index(heading)  # ValueError when the section is missing
    section: list[str] = []
    for line in lines[start + 1 :]:
        if line.startswith("## ") or line == "##":
            break
        section.append(line)
    match = re.search(r"^```python\n(.*?)^```", "\n".join(section) + "\n", re.S | re.M)
    if match is None:
        raise AssertionError(f"no ```python block under {heading!r}")
    return match.group(1)


def test_the_readme_terminal_snippet_prints_an_approval(
    pg_backend: Backend, tmp_path: Path
) -> None:
    snippet = first_python_block(README.read_text(encoding="utf-8"), HEADING)
    merchant = Merchant.create(pg_backend, f"readme-{uuid.uuid4().hex[:8]}")
    server = pg_backend.server()
    env = {**os.environ, "IDEMPAY_URL": server.url, "IDEMPAY_API_KEY": merchant.api_key}
    try:
        done = subprocess.run(
            [sys.executable, "-c", snippet],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        server.stop()
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(r"approved [A-Z0-9]{6}\n", done.stdout), done.stdout
    [entry] = journal_entries(tmp_path / "pos.db")
    assert entry.state is JournalState.RESOLVED
    assert merchant.transactions() == {entry.key: "approved"}
    assert merchant.charges() == {entry.key: 1}
