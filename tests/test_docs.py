"""Docs are part of the contract: every setting documented, README examples runnable."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from api.config import Settings
from tests.support.backend import Backend

ROOT = Path(__file__).resolve().parents[1]


def test_every_setting_is_documented() -> None:
    text = (ROOT / "docs" / "configuration.md").read_text()
    for name in Settings.model_fields:
        assert f"`IDEMPAY_{name.upper()}`" in text, name


def _block(heading: str, language: str, contains: str) -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme.split(heading, 1)[1]
    for block in re.findall(rf"```{language}\n(.*?)```", section, flags=re.S):
        if contains in block:
            return block
    raise AssertionError(f"no {language} block containing {contains!r} under {heading}")


def test_readme_curl_walkthrough_runs_as_documented(pg_backend: Backend) -> None:
    server = pg_backend.server()
    try:
        script = _block("## Run it and talk to it", "bash", "Idempotency-Key: $KEY")
        env = {
            **os.environ,
            "IDEMPAY_URL": server.url,
            "IDEMPAY_API_KEY": pg_backend.api_key("merchant-readme"),
        }
        out = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
    finally:
        server.stop()
    statuses = re.findall(r"HTTP/1\.1 (\d{3}) ", out)
    assert statuses == ["201", "201", "200", "200", "410"], out
    lowered = out.lower()
    assert "idempotent-replayed: true" in lowered
    assert "idempotency-status: replayed" in lowered
    assert '"status":"aborted"' in out and "transaction_aborted" in out
