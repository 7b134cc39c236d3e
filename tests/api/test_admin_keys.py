"""`idempay admin list-keys` / `revoke-key`: a revoked key is refused (after the per-process
auth cache, at most a minute; a fresh server here), other keys keep working, and nothing
the commands print holds a whole key."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support.backend import Backend
from tests.support.client import Api, assert_problem, new_key
from tests.support.services import ROOT


def _idempay(backend: Backend, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "api", "admin", *args],
        cwd=ROOT,
        env={**os.environ, **backend.env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_revoke_key_by_prefix_id_or_whole_key(private_backend: Backend) -> None:
    backend = private_backend
    keys = [backend.api_key("merchant-revoke") for _ in range(3)]
    other = backend.api_key("merchant-keeps")

    listed = _idempay(backend, "list-keys", "--merchant", "merchant-revoke")
    assert listed.returncode == 0, listed.stderr
    rows = [line.split("\t") for line in listed.stdout.splitlines()]
    assert len(rows) == 3 and all(row[4] == "active" for row in rows)
    assert not any(key in listed.stdout for key in [*keys, other])
    key_ids = {row[2].rstrip("…"): row[1] for row in rows}

    by_prefix = _idempay(backend, "revoke-key", "--prefix", keys[0][:8])
    by_id = _idempay(backend, "revoke-key", "--prefix", key_ids[keys[1][:8]])
    by_whole = _idempay(backend, "revoke-key", "--prefix", keys[2])
    for done in (by_prefix, by_id, by_whole):
        assert done.returncode == 0 and done.stdout.startswith("revoked "), done.stderr
        assert not any(key in done.stdout + done.stderr for key in keys)

    again = _idempay(backend, "revoke-key", "--prefix", keys[0][:8])
    assert again.returncode == 1 and "nothing revoked" in again.stderr
    too_short = _idempay(backend, "revoke-key", "--prefix", "idp_")
    assert too_short.returncode != 0

    server = backend.server()
    try:
        for key in keys:
            assert_problem(Api(server.url, key).lookup(new_key()), 401, "unauthorized")
        assert Api(server.url, other).lookup(new_key()).status_code == 404
    finally:
        server.stop()
    listed = _idempay(backend, "list-keys", "--merchant", "merchant-revoke")
    assert all(line.split("\t")[4] != "active" for line in listed.stdout.splitlines())


def test_an_ambiguous_prefix_revokes_nothing(private_backend: Backend) -> None:
    backend = private_backend
    key = backend.api_key("merchant-ambiguous")
    backend.api_key("merchant-ambiguous")
    # Two keys sharing their first 8 characters (1 in 16.7 M by chance): make them collide.
    backend.sql("UPDATE api_key SET prefix = :p", p=key[:8])
    done = _idempay(backend, "revoke-key", "--prefix", key[:8])
    assert done.returncode == 1 and "several active keys match" in done.stderr
    assert backend.sql("SELECT count(*) FROM api_key WHERE revoked_at IS NOT NULL") == [(0,)]
