"""Where the SDK learns the server's clock: only from idempay's own answers (they carry
X-Request-Id). A proxy's error page or a stale cache may carry any Date; one such answer
used to move the offset (the hostile review's R2: a Date a day ahead cost the next sale)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path

import httpx

from client_sdk import Client


def _date(offset_s: float) -> str:
    return format_datetime(datetime.now(UTC) + timedelta(seconds=offset_s), usegmt=True)


def test_a_date_from_an_answer_that_is_not_idempays_is_not_the_servers_clock(
    tmp_path: Path,
) -> None:
    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/healthz":  # idempay itself, 120 s ahead of the terminal
            return httpx.Response(200, json={"status": "ok"},
                                  headers={"Date": _date(120), "X-Request-Id": "r1"})  # fmt: skip
        # a proxy's error page, no X-Request-Id, a Date a day ahead
        return httpx.Response(502, text="bad gateway", headers={"Date": _date(86_400)})

    with Client("http://idempay.test", "idp_test", terminal_id="T-1", journal=tmp_path / "p.db",
                transport=httpx.MockTransport(handle)) as pos:  # fmt: skip
        pos._learn_clock()
        learned = pos.clock_offset_s
        pos._http.get("/v1/transactions/x")  # the proxy's page passes through the client
        sent_at = time.time()
        response = pos._http.get("/v1/transactions/y")
        pos._observe_clock(response, sent_at)
    assert learned is not None and abs(learned - 120) < 3
    assert pos.clock_offset_s == learned


def test_healthz_is_never_cached(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from api.config import Settings
    from api.main import create_app

    app = create_app(Settings(var_dir=tmp_path, completer_enabled=False))
    with TestClient(app) as client:
        response = client.get("/healthz")
    assert response.status_code == 200
    assert response.headers["cache-control"] == "no-store"
    assert "x-request-id" in response.headers
