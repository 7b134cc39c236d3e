"""Retention (SPEC §3.5): tombstones and exported events are purged after the window, and
a late create for a purged key is refused by the age rule rather than processed."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta

from tests.support.backend import Backend
from tests.support.client import Api, assert_problem, body, new_key
from tests.support.services import ROOT

WINDOW = {"IDEMPAY_TOMBSTONE_RETENTION": "3s"}


def _uuid7(at: datetime) -> str:
    millis = int(at.timestamp() * 1000)
    raw = (millis << 80) | (0x7 << 76) | (uuid.uuid4().int & ((1 << 76) - 1))
    raw = (raw & ~(0x3 << 62)) | (0x2 << 62)  # RFC 9562 variant
    return str(uuid.UUID(int=raw))


def _purge(backend: Backend) -> str:
    return subprocess.run(
        [sys.executable, "-m", "api", "purge"],
        cwd=ROOT,
        env={**os.environ, **backend.env, **WINDOW},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout


def test_purged_tombstone_cannot_let_a_late_original_through(pg_backend: Backend) -> None:
    server = pg_backend.server(**WINDOW)
    api = Api(server.url, pg_backend.api_key("merchant-retention"))
    try:
        captured = datetime.now(UTC)
        aborted, processed = new_key(), new_key()
        minted_v7 = _uuid7(captured)
        api.create(processed, body(captured_at=captured.isoformat()))
        assert api.abort(aborted).json()["status"] == "aborted"
        assert api.abort(minted_v7).json()["status"] == "aborted"
        old_event = pg_backend.sql("SELECT count(*) FROM request_event")[0][0]
        pg_backend.sql(  # as if exported to the lake
            "UPDATE request_event SET exported_at = ts WHERE merchant_id = "
            "(SELECT id FROM merchant WHERE name = 'merchant-retention')"
        )
        time.sleep(3.5)

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
    finally:
        server.stop()


def test_unexported_events_are_kept(pg_backend: Backend) -> None:
    server = pg_backend.server(**WINDOW)
    api = Api(server.url, pg_backend.api_key("merchant-retention-2"))
    try:
        key = new_key()
        api.create(key)
        time.sleep(0.3)
        pg_backend.sql(
            "UPDATE request_event SET exported_at = NULL WHERE idempotency_key = :k", k=key
        )
        time.sleep(3.5)
        _purge(pg_backend)
        kept = pg_backend.sql(
            "SELECT count(*) FROM request_event WHERE idempotency_key = :k", k=key
        )
        assert kept[0][0] == 1
    finally:
        server.stop()


def test_policy_reports_the_configured_window(pg_backend: Backend) -> None:
    server = pg_backend.server(**WINDOW)
    try:
        with Api(server.url, "unused").client() as client:
            policy = client.get("/v1/idempotency-policy").json()
        assert policy["tombstone_retention_seconds"] == 3.0
        assert policy["captured_at_max_age_seconds"] == 3.0
    finally:
        server.stop()


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
