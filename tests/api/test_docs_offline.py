"""/docs renders in a network without internet: Swagger UI's assets are served by the app
(headless Chromium resolving no host but 127.0.0.1). Before, the page pulled Swagger UI from
a CDN and stayed blank offline."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.support.backend import Backend

ROOT = Path(__file__).resolve().parents[2]
OFFLINE = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-default-apps",
    "--disable-sync",
    "--disable-extensions",
    "--no-first-run",
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",  # the network is cut
    "--virtual-time-budget=10000",
    "--dump-dom",
]


@pytest.fixture(scope="module")
def chromium() -> str:
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "ensure_chromium.sh")],
        capture_output=True,
        text=True,
        timeout=900,
        check=True,
    )
    return done.stdout.strip().splitlines()[-1]


def test_docs_render_with_the_network_cut(chromium: str, sqlite_backend: Backend) -> None:
    server = sqlite_backend.server()
    try:
        page = server.url + "/docs"
        dom = subprocess.run(
            [chromium, *OFFLINE, page], capture_output=True, text=True, timeout=120, check=True
        ).stdout
    finally:
        server.stop()
    assert not re.search(r"(src|href)=\"https?://(?!127\.0\.0\.1)", dom), "a remote asset"
    # Rendered by Swagger UI's JavaScript: the operations of the API are on the page.
    assert "opblock" in dom and "/v1/transactions" in dom
