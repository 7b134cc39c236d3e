"""/metrics with several uvicorn workers: whichever worker answers the scrape reports every
worker's requests (Prometheus multiprocess mode set up by `idempay serve --workers N`)."""

from __future__ import annotations

import re
from pathlib import Path

import httpx

from tests.support.backend import Backend
from tests.support.client import new_key

LOOKUPS = 60
_LINE = re.compile(
    r'^idempay_requests_total\{endpoint="lookup",outcome="not_found"\} ([0-9.e+]+)$', re.M
)


def test_every_scrape_sums_all_workers(pg_backend: Backend, tmp_path: Path) -> None:
    directory = tmp_path / "metrics"
    server = pg_backend.server(workers=2, PROMETHEUS_MULTIPROC_DIR=str(directory))
    try:
        auth = {"Authorization": f"Bearer {pg_backend.api_key('merchant-metrics')}"}
        for _ in range(LOOKUPS):  # a new connection each: the kernel spreads them
            with httpx.Client(base_url=server.url, headers=auth) as client:
                assert client.get(f"/v1/transactions/{new_key()}").status_code == 404
        writers = {p.name.rsplit("_", 1)[1] for p in directory.glob("counter_*.db")}
        assert len(writers) >= 2, "both workers should have answered some requests"
        for _ in range(6):
            with httpx.Client(base_url=server.url) as client:
                text = client.get("/metrics").text
            counts = [float(value) for value in _LINE.findall(text)]
            assert counts == [LOOKUPS], text[:2000]
            assert "idempay_in_flight_keys" in text
    finally:
        server.stop()
