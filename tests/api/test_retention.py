"""Retention (contract §3.5): tombstones and exported events are purged after the window, and
a late create for a purged key is refused by the age rule rather than processed."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import update

from api.db import create_engine
from api.models import IdempotencyKey
from tests.support.backend import Backend
from tests.support.client import Api, assert_problem, body, new_key
from tests.support.eventually import eventually
from tests.support.services import ROOT, Server

# No clock-skew tolerance here: tombstones go at the retention itself (see SKEW below).
WINDOW = {"IDEMPAY_TOMBSTONE_RETENTION": "3s", "IDEMPAY_CLOCK_SKEW_TOLERANCE": "0s"}


def _uuid7(at: datetime) -> str:
    millis = int(at.timestamp() * 1000)
    raw = (millis << 80) | (0x7 << 76) | (uuid.uuid4().int & ((1 << 76) - 1))
    raw = (raw & ~(0x3 << 62)) | (0x2 << 62)  # RFC 9562 variant
    return str(uuid.UUID(int=raw))


def _purge(backend: Backend, window: dict[str, str] = WINDOW) -> str:
    return subprocess.run(
        [sys.executable, "-m", "api", "purge"],
        cwd=ROOT,
        env={**os.environ, **backend.env, **window},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout


@pytest.fixture(scope="module")
def window_server(pg_backend: Backend) -> Iterator[Server]:
    """One server with the 3 s window for the three tests that ask for it (each with a
    merchant of its own, or none): a server start costs seconds on a loaded machine."""
    server = pg_backend.server(**WINDOW)
    try:
        yield server
    finally:
        server.stop()


def test_purged_tombstone_cannot_let_a_late_original_through(
    pg_backend: Backend, window_server: Server
) -> None:
    server = window_server
    api = Api(server.url, pg_backend.api_key("merchant-retention"))
    captured = datetime.now(UTC)
    aborted, processed = new_key(), new_key()
    minted_v7 = _uuid7(captured)
    api.create(processed, body(captured_at=captured.isoformat()))
    assert api.abort(aborted).json()["status"] == "aborted"
    assert api.abort(minted_v7).json()["status"] == "aborted"
    eventually(  # the three requests' events, flushed by the server's writer
        lambda: pg_backend.sql(
            "SELECT count(*) FROM request_event WHERE idempotency_key IN (:a, :b, :c)",
            a=aborted,
            b=processed,
            c=minted_v7,
        )[0][0],
        until=lambda count: count == 3,
        what="the request events of the create and the two aborts",
    )
    old_event = pg_backend.sql("SELECT count(*) FROM request_event")[0][0]
    pg_backend.sql(  # as if exported to the lake
        "UPDATE request_event SET exported_at = ts WHERE merchant_id = "
        "(SELECT id FROM merchant WHERE name = 'merchant-retention')"
    )
    time.sleep(3.5)  # past the 3 s retention window: time itself, nothing to poll

    out = _purge(pg_backend)
    assert "purged tombstones=" in out
    remaining = pg_backend.sql(
        "SELECT key FROM idempotency_key WHERE key IN (:a, :b, :c)",
        a=aborted,
        b=processed,
        c=minted_v7,
    )
    assert [row[0] for row in remaining] == [processed]  # processed keys live forever
    assert pg_backend.sql("SELECT count(*) FROM request_event")[0][0] < old_event

    late = api.create(aborted, body(captured_at=captured.isoformat()))
    assert_problem(late, 410, "request_expired")
    late_v7 = api.create(minted_v7, body())  # no captured_at: the key's mint time rules
    assert_problem(late_v7, 410, "request_expired")
    for key in (aborted, minted_v7):
        count = pg_backend.sql('SELECT count(*) FROM "transaction" WHERE id = :k', k=key)
        assert count[0][0] == 0
    assert api.create(processed, body(captured_at=captured.isoformat())).status_code == 201


def test_unexported_events_are_kept(pg_backend: Backend, window_server: Server) -> None:
    server = window_server
    api = Api(server.url, pg_backend.api_key("merchant-retention-2"))
    key = new_key()
    api.create(key)
    eventually(
        lambda: pg_backend.sql(
            "SELECT count(*) FROM request_event WHERE idempotency_key = :k", k=key
        )[0][0],
        what="the create's request event",
    )
    pg_backend.sql("UPDATE request_event SET exported_at = NULL WHERE idempotency_key = :k", k=key)
    time.sleep(3.5)  # past the 3 s retention window: time itself, nothing to poll
    _purge(pg_backend)
    kept = pg_backend.sql("SELECT count(*) FROM request_event WHERE idempotency_key = :k", k=key)
    assert kept[0][0] == 1


def test_policy_reports_the_configured_window(window_server: Server) -> None:
    with Api(window_server.url, "unused").client() as client:
        policy = client.get("/v1/idempotency-policy").json()
    assert policy["tombstone_retention_seconds"] == 3.0
    assert policy["captured_at_max_age_seconds"] == 3.0


def test_expired_key_mint_time_is_checked_only_for_new_keys(pg_backend: Backend) -> None:
    server = pg_backend.server()
    api = Api(server.url, pg_backend.api_key("merchant-retention-3"))
    try:
        old = _uuid7(datetime.now(UTC) - timedelta(days=40))
        assert_problem(api.create(old), 410, "request_expired")
        fresh = _uuid7(datetime.now(UTC))
        assert api.create(fresh).status_code == 201
    finally:
        server.stop()


# ------------------------------------------------------------- clocks ahead (issue 14, item 2)
SKEW = {"IDEMPAY_TOMBSTONE_RETENTION": "60s", "IDEMPAY_CLOCK_SKEW_TOLERANCE": "30s"}


def _age_tombstones(backend: Backend, keys: list[str], seconds: float) -> None:
    """As if these keys had been fenced ``seconds`` ago (no sleeping through the window)."""

    async def run() -> None:
        engine = create_engine(backend.settings)
        try:
            async with engine.begin() as conn:
                then = datetime.now(UTC) - timedelta(seconds=seconds)
                await conn.execute(
                    update(IdempotencyKey)
                    .where(IdempotencyKey.key.in_(keys))
                    .values(created_at=then, updated_at=then)
                )
        finally:
            await engine.dispose()

    asyncio.run(run())


def _keys_left(backend: Backend, keys: list[str]) -> set[str]:
    rows = backend.sql(
        "SELECT key FROM idempotency_key WHERE key IN (" + ", ".join(f"'{k}'" for k in keys) + ")"
    )
    return {row[0] for row in rows}


def test_a_clock_ahead_cannot_outlive_a_purged_tombstone(private_backend: Backend) -> None:
    """Issue 14, item 2: abort K, purge once the tombstone is older than the retention, then
    the late original with a terminal clock ahead (within the tolerance) arrives. The purge
    must have kept the tombstone (retention + tolerance): 410, never a 201 after 'aborted'."""
    backend = private_backend
    server = backend.server(**SKEW)
    api = Api(server.url, backend.api_key("merchant-clock-ahead"))
    try:
        now = datetime.now(UTC)
        v4 = new_key()
        v7 = _uuid7(now + timedelta(seconds=20))  # minted by a clock 20 s ahead
        for key in (v4, v7):
            assert api.abort(key).json()["status"] == "aborted"
        _age_tombstones(backend, [v4, v7], 70)  # past the retention, within retention + skew
        _purge(backend, SKEW)

        ahead = (datetime.now(UTC) + timedelta(seconds=20)).isoformat()
        assert_problem(api.create(v4, body(captured_at=ahead)), 410, "transaction_aborted")
        assert_problem(api.create(v7, body()), 410, "transaction_aborted")
        assert _keys_left(backend, [v4, v7]) == {v4, v7}

        _age_tombstones(backend, [v4, v7], 95)  # past retention + tolerance: now they may go
        _purge(backend, SKEW)
        assert _keys_left(backend, [v4, v7]) == set()
        assert backend.sql('SELECT count(*) FROM "transaction"')[0][0] == 0
    finally:
        server.stop()


def test_a_time_too_far_ahead_is_422_clock_skew_and_nothing_is_stored(
    private_backend: Backend,
) -> None:
    backend = private_backend
    server = backend.server(**SKEW)
    api = Api(server.url, backend.api_key("merchant-clock-skew"))
    try:
        far = datetime.now(UTC) + timedelta(minutes=5)
        v4, v7 = new_key(), _uuid7(far)
        problem = assert_problem(
            api.create(v4, body(captured_at=far.isoformat())), 422, "clock_skew"
        )
        assert "captured_at" in problem["detail"]
        assert_problem(api.create(v7, body()), 422, "clock_skew")
        assert _keys_left(backend, [v4, v7]) == set()
        assert backend.sql('SELECT count(*) FROM "transaction"')[0][0] == 0
        # the same key with a sane clock is processed: nothing was stored under it
        assert api.create(v4, body(captured_at=datetime.now(UTC).isoformat())).status_code == 201
        with api.client() as client:
            policy = client.get("/v1/idempotency-policy").json()
        assert policy["clock_skew_tolerance_seconds"] == 30.0
        assert policy["tombstone_min_age_seconds"] == 90.0
    finally:
        server.stop()
