"""The bench's bypass route is not in the server (issue 23, item 7): no setting mounts it;
only the bench's own app (``loadtest/_bench_app.py``) serves it."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest

from api.config import Settings
from loadtest import _bench_env
from tests.support.backend import Backend
from tests.support.client import Api, assert_problem, body, new_key


def test_no_setting_of_the_server_mounts_the_bypass(pg_backend: Backend) -> None:
    assert not [name for name in Settings.model_fields if "bench" in name or "bypass" in name]
    assert importlib.util.find_spec("api.transactions.bypass") is None
    server = pg_backend.server(IDEMPAY_BENCH_BYPASS="true")  # the old switch does nothing
    try:
        api = Api(server.url, pg_backend.api_key("merchant-no-bypass"))
        with api.client() as client:
            response = client.post(
                "/_bench/transactions", json=body(), headers=api.headers(new_key())
            )
        assert_problem(response, 404, "not_found")
        assert "/_bench/transactions" not in server_paths(api)
    finally:
        server.stop()


def server_paths(api: Api) -> set[str]:
    with api.client() as client:
        return set(client.get("/openapi.json").json()["paths"])


@pytest.fixture
def bench_database() -> Iterator[str]:
    name = _bench_env.create_database()
    try:
        yield name
    finally:
        _bench_env.drop_database(name)


@pytest.mark.server  # a private Postgres database and the bench's server process
def test_the_bench_app_serves_the_bypass_beside_the_real_create(
    bench_database: str, tmp_path: Path
) -> None:
    """What `make bench` measures: both routes, on the bench's own server process."""
    api_key = _bench_env.prepare_database(bench_database)
    server = _bench_env.Server(bench_database, tmp_path / "bench.log").start()
    try:
        api = Api(server.url, api_key)
        with api.client() as client:
            bypassed = client.post(
                "/_bench/transactions", json=body(), headers=api.headers(new_key())
            )
        assert bypassed.status_code == 201, bypassed.text
        assert bypassed.json()["status"] == "approved"
        assert api.create(new_key()).status_code == 201
    finally:
        server.stop()
