"""`idempay admin key reverse` with Redis configured: a server that cached the key's
"approved" lookup answers "reversed" right after the command, as after the reversal route
(contract §3.7) — the command tells Redis through the same code."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from api.acquirer.host import store as acquirer_store
from api.acquirer.messages import rrn_for
from api.cli import app
from tests.support.backend import FAST_ENV, Backend
from tests.support.client import Api, new_key


def test_a_cached_approval_is_not_served_after_the_command(
    pg_backend: Backend, shared_redis: dict[str, str]
) -> None:
    server = pg_backend.server(
        IDEMPAY_REDIS_URL=shared_redis["IDEMPAY_REDIS_URL"],
        IDEMPAY_REDIS_PREFIX=shared_redis["IDEMPAY_REDIS_PREFIX"],
    )
    try:
        api = Api(server.url, pg_backend.api_key("merchant-op-cache"))
        key = new_key()
        assert api.create(key).status_code == 201
        for _ in range(2):  # the second is served from the cache
            assert api.lookup(key).json()["status"] == "approved"
        env = {**pg_backend.env, **FAST_ENV, **shared_redis}
        args = ["admin", "key", "reverse", "merchant-op-cache", key, "--reason", "refund desk"]
        done = CliRunner().invoke(app, args, env=env)
        # the command's answer is its last line (the acquirer link it opens for the 0400 logs
        # before it)
        assert done.exit_code == 0, done.output
        assert done.output.splitlines()[-1].startswith("reversed now: "), done.output
        assert api.lookup(key).json()["status"] == "reversed"
        merchant = pg_backend.sql("SELECT merchant_id FROM idempotency_key WHERE key = :k", k=key)
        rrn = rrn_for(pg_backend.settings.secret_key.encode(), merchant[0][0], key)
        host = Path(env["IDEMPAY_VAR_DIR"]) / "acquirer.sqlite3"
        assert acquirer_store.summary(host)[rrn].reversed  # the acquirer was told
    finally:
        server.stop()
