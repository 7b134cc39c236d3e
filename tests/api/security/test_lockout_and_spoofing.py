"""One client cannot lock other merchants out, nor hide behind forged addresses (issue 23,
items 1 and 3; docs/security.md, "API keys" and "Client address").

The servers trust X-Forwarded-For from 127.0.0.1 (uvicorn's default), so each request
below comes from the address its header names — as behind the deployed proxy.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from limits import parse

from tests.api.security.conftest import KeptApi
from tests.support.backend import Backend
from tests.support.client import assert_problem, body, new_key
from tests.support.services import Server, shared_redis_env

ATTACKER = "203.0.113.7"


def _guess() -> str:
    return "Bearer idp_" + secrets.token_urlsafe(32)


def _lookup(client: httpx.Client, authorization: str, address: str) -> httpx.Response:
    headers = {"Authorization": authorization, "X-Forwarded-For": address}
    return client.get(f"/v1/transactions/{new_key()}", headers=headers)


def _create(client: httpx.Client, api_key: str, address: str) -> httpx.Response:
    headers = {
        "Authorization": f"Bearer {api_key}",
        "Idempotency-Key": new_key(),
        "X-Forwarded-For": address,
    }
    return client.post("/v1/transactions", json=body(terminal_id="T-VICTIM"), headers=headers)


@pytest.fixture
def redis_env() -> Iterator[dict[str, str]]:
    with shared_redis_env() as env:
        yield env


def test_lockout_reproduction_leaves_the_victims_at_zero_429(
    pg_backend: Backend, redis_env: dict[str, str]
) -> None:
    """30 bad keys, a restart (the failure count survives in Redis), then a bad key between
    every payment from the same address: the merchants there — one that paid before the
    restart, one whose key is new — are never refused, on any worker; the attacker is."""
    env = {**redis_env, "IDEMPAY_AUTH_FAILURE_LIMIT": "30/minute"}
    victim = pg_backend.api_key("merchant-lockout-victim")
    first = pg_backend.server(**env)
    try:
        with httpx.Client(base_url=first.url, timeout=30) as client:
            assert _create(client, victim, ATTACKER).status_code == 201
            for _ in range(30):
                assert_problem(_lookup(client, _guess(), ATTACKER), 401, "unauthorized")
            assert_problem(_lookup(client, _guess(), ATTACKER), 429, "rate_limited")
    finally:
        first.stop()

    newcomer = pg_backend.api_key("merchant-lockout-newcomer")  # never used anywhere
    second = pg_backend.server(workers=2, **env)  # a restart, on fresh workers
    try:
        statuses: dict[str, list[int]] = {"victim": [], "newcomer": [], "attacker": []}
        for _ in range(20):  # new connections, so both workers take turns
            with httpx.Client(base_url=second.url, timeout=30) as client:
                statuses["attacker"].append(_lookup(client, _guess(), ATTACKER).status_code)
                statuses["victim"].append(_create(client, victim, ATTACKER).status_code)
                statuses["newcomer"].append(_create(client, newcomer, ATTACKER).status_code)
        assert statuses["victim"] == [201] * 20, statuses
        assert statuses["newcomer"] == [201] * 20, statuses
        assert statuses["attacker"] == [429] * 20, statuses
    finally:
        second.stop()


LIMIT = 5


@pytest.fixture(scope="module")
def limited(pg_backend: Backend) -> Iterator[tuple[Server, KeptApi]]:
    server = pg_backend.server(IDEMPAY_AUTH_FAILURE_LIMIT=f"{LIMIT}/minute")
    api = KeptApi(server.url, pg_backend.api_key("merchant-spoofing"))
    try:
        yield server, api
    finally:
        api.close()
        server.stop()


def _failures_until_limited(api: KeptApi, addresses: list[str]) -> list[int]:
    return [_lookup(api.client(), _guess(), address).status_code for address in addresses]


def test_a_forged_address_that_is_not_an_ip_is_no_identity(
    limited: tuple[Server, KeptApi],
) -> None:
    """Rotating garbage in X-Forwarded-For no longer buys a fresh budget per value."""
    _server, api = limited
    forged = [f"not-an-ip-{n}" for n in range(LIMIT + 5)]
    statuses = _failures_until_limited(api, forged)
    assert statuses == [401] * LIMIT + [429] * 5, statuses
    assert _lookup(api.client(), f"Bearer {api.api_key}", "not-an-ip-x").status_code == 404


def test_ipv6_clients_are_counted_by_their_64(limited: tuple[Server, KeptApi]) -> None:
    """One subscriber's /64 holds 2^64 addresses: rotating within it is one identity."""
    _server, api = limited
    rotating = [f"2001:db8:1:2::{n:x}" for n in range(1, LIMIT + 6)]
    statuses = _failures_until_limited(api, rotating)
    assert statuses == [401] * LIMIT + [429] * 5, statuses
    # the next /64 is someone else
    assert _lookup(api.client(), _guess(), "2001:db8:1:3::1").status_code == 401
    # and the subscriber's valid key still works from the blocked /64
    assert _lookup(api.client(), f"Bearer {api.api_key}", "2001:db8:1:2::ff").status_code == 404


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_distinct_forged_addresses_do_not_grow_the_server(
    limited: tuple[Server, KeptApi],
) -> None:
    """The reproduction: 60 KB distinct X-Forwarded-For values, each a failed key. Each was
    kept as an address; 2,000 of them are 120 MB of distinct strings."""
    server, api = limited
    count, size = 2000, 60_000
    before = _rss_bytes(server.pid)
    for n in range(count):
        forged = f"{n:08d}".ljust(size, "x")
        response = _lookup(api.client(), _guess(), forged)
        assert response.status_code in (401, 429)
    grown = _rss_bytes(server.pid) - before
    assert grown < count * size // 4, f"grew {grown / 1e6:.0f} MB"


def test_the_limiter_memory_is_bounded_by_its_capacity() -> None:
    """Distinct identities beyond the capacity evict the least recently used."""
    from api.ratelimit import BoundedWindows  # here: the other tests run without it

    windows = BoundedWindows(capacity=1000)
    item = parse("3/minute")

    async def flood() -> None:
        for n in range(20_000):
            await windows.hit(item, "authfail", f"198.51.{n // 256 % 256}.{n % 256}-{n}")
        for _ in range(4):  # the most recent identity is still counted
            await windows.hit(item, "authfail", "192.0.2.1")
        assert not await windows.test(item, "authfail", "192.0.2.1")

    asyncio.run(flood())
    assert len(windows) == 1000
