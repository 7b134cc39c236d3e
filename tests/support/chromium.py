"""Headless Chromium for the tests that render a page (report.html, /docs)."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-default-apps",
    "--disable-sync",
    "--disable-extensions",
    "--no-first-run",
    "--metrics-recording-only",
    "--dump-dom",
]


def ensure_chromium() -> str:
    """The path of a Chromium binary (installed by scripts/ensure_chromium.sh if missing)."""
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "ensure_chromium.sh")],
        capture_output=True,
        text=True,
        timeout=900,
        check=True,
    )
    return done.stdout.strip().splitlines()[-1]
