"""/docs renders in a network without internet: Swagger UI's assets are served by the app
(headless Chromium resolving no host but 127.0.0.1). Before, the page pulled Swagger UI from
a CDN and stayed blank offline."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.support.backend import Backend
from tests.support.chromium import FLAGS, ensure_chromium

OFFLINE = [
    *FLAGS,
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",  # the network is cut
    "--virtual-time-budget=10000",
]


@pytest.fixture(scope="module")
def chromium() -> str:
    return ensure_chromium()


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
