"""The outbox relay (at least once, in order per merchant, deduped by event_id) and the
Redis-backed rate limit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import defaultdict

import pytest
import redis

from api.outbox.relay import consume
from tests.api.redis.conftest import SHARED_REDIS
from tests.support.backend import Backend
from tests.support.client import Api, assert_problem, body, new_key
from tests.support.eventually import eventually
from tests.support.services import ROOT, RedisServer


def _relay(env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "api", "relay"],
        cwd=ROOT,
        env={**os.environ, **env},
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def test_relay_killed_mid_batch_publishes_everything_and_consumers_see_each_once(
    pg_backend: Backend, shared_redis: dict[str, str]
) -> None:
    env = {**pg_backend.env, **shared_redis}
    server = pg_backend.server(**shared_redis)
    merchants = [Api(server.url, pg_backend.api_key(f"merchant-outbox-{i}")) for i in range(2)]
    try:
        for api in merchants:
            for _ in range(30):
                key = new_key()
                api.create(key, body(terminal_id="T-OUTBOX"))
            api.abort(new_key())
            api.reverse(key)
    finally:
        server.stop()
    expected = pg_backend.sql(
        "SELECT o.event_id, o.merchant_id, o.seq FROM outbox_event o "
        "JOIN merchant m ON m.id = o.merchant_id WHERE m.name LIKE 'merchant-outbox-%'"
    )
    assert len(expected) == 2 * 32  # 30 completed + 1 aborted + 1 reversed per merchant

    stream = f"{shared_redis['IDEMPAY_REDIS_PREFIX']}outbox"
    client = redis.Redis.from_url(SHARED_REDIS)
    relay_env = {**env, "IDEMPAY_RELAY_BATCH": "10", "IDEMPAY_RELAY_MARK_DELAY": "1.0"}
    relay = _relay(relay_env)
    # a batch is published, and not yet marked sent (the relay pauses 1 s before marking)
    eventually(lambda: client.xlen(stream), what="the relay's first published batch", timeout=20)
    os.killpg(relay.pid, signal.SIGKILL)
    relay.wait(5)
    unsent_after_kill = pg_backend.sql("SELECT count(*) FROM outbox_event WHERE sent_at IS NULL")
    assert unsent_after_kill[0][0] > 0

    relay = _relay({**env, "IDEMPAY_RELAY_BATCH": "10"})
    try:
        eventually(
            lambda: pg_backend.sql("SELECT count(*) FROM outbox_event WHERE sent_at IS NULL"),
            until=lambda unsent: unsent[0][0] == 0,
            what="the relay to drain the outbox (events not sent)",
            timeout=30,
        )
    finally:
        os.killpg(relay.pid, signal.SIGTERM)
        relay.wait(5)

    entries = client.xrange(stream)
    assert len(entries) > len(expected)  # the killed batch went out twice: at least once
    seen: set[str] = set()
    ours = {row[1] for row in expected}  # the shared test database has other merchants too
    events = [event for event in consume(entries, seen) if event["merchant_id"] in ours]
    assert sorted(e["event_id"] for e in events) == sorted(row[0] for row in expected)
    by_merchant: dict[str, list[int]] = defaultdict(list)
    for event in events:
        by_merchant[event["merchant_id"]].append(event["seq"])
    for seqs in by_merchant.values():
        assert seqs == list(range(1, len(seqs) + 1))  # commit order, no gaps
    types = {e["type"] for e in events}
    assert types == {"transaction.completed", "transaction.aborted", "transaction.reversed"}
    completed = next(e for e in events if e["type"] == "transaction.completed")
    assert completed["data"]["status"] == "approved" and "token" not in json.dumps(completed)
    assert client.ttl(stream) > 0


def test_rate_limit_on_redis_is_per_api_key(
    pg_backend: Backend, shared_redis: dict[str, str]
) -> None:
    server = pg_backend.server(**shared_redis, IDEMPAY_RATE_LIMIT="5/minute")
    try:
        noisy = Api(server.url, pg_backend.api_key("merchant-rl-noisy"))
        calm = Api(server.url, pg_backend.api_key("merchant-rl-calm"))
        answers = [noisy.lookup(new_key()) for _ in range(15)]
        limited = [r for r in answers if r.status_code == 429]
        assert limited
        for response in limited:
            assert_problem(response, 429, "rate_limited")
            assert int(response.headers["retry-after"]) >= 1
        assert calm.lookup(new_key()).status_code == 404
        client = redis.Redis.from_url(SHARED_REDIS)
        names = list(client.scan_iter(f"{shared_redis['IDEMPAY_REDIS_PREFIX']}rl*"))
        assert names and all(client.ttl(name) > 0 for name in names)
    finally:
        server.stop()


def test_rate_limit_falls_back_to_memory_while_redis_is_down(
    pg_backend: Backend, private_redis: RedisServer
) -> None:
    server = pg_backend.server(IDEMPAY_REDIS_URL=private_redis.url, IDEMPAY_RATE_LIMIT="5/minute")
    try:
        api = Api(server.url, pg_backend.api_key("merchant-rl-fallback"))
        private_redis.kill()
        answers = [api.lookup(new_key()) for _ in range(15)]
        statuses = {r.status_code for r in answers}
        assert statuses == {404, 429}, statuses  # still limited, never a 5xx
        for response in answers:
            if response.status_code == 429:
                assert_problem(response, 429, "rate_limited")
        log = server.log_path.read_text()
        # one warning per circuit trip (1 s), not one per request
        assert 1 <= log.count("rate_limit_degraded") < len(answers)
    finally:
        server.stop()


@pytest.mark.parametrize("store", ["redis", "memory"])
def test_a_create_counts_once_against_the_per_key_limit(
    pg_backend: Backend, shared_redis: dict[str, str], store: str
) -> None:
    """``20/minute`` lets 20 creates through, as it lets 20 lookups (issue 23, item 4)."""
    env = shared_redis if store == "redis" else {"IDEMPAY_REDIS_URL": ""}
    server = pg_backend.server(**env, IDEMPAY_RATE_LIMIT="20/minute")
    try:
        api = Api(server.url, pg_backend.api_key(f"merchant-rl-once-{store}"))
        statuses = [
            api.create(new_key(), body(terminal_id=f"T-{n}")).status_code for n in range(20)
        ]
        assert statuses == [201] * 20, statuses
        assert_problem(api.create(new_key()), 429, "rate_limited")
    finally:
        server.stop()
