"""Redis is advisory (SPEC §3.4): killed or flushed mid-run, every guarantee still holds;
a cached answer is never served for a different payload."""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections import Counter

import aiohttp
import redis

from tests.support.backend import Backend
from tests.support.client import Api, assert_problem, body, new_key
from tests.support.forwarder import Forwarder
from tests.support.services import RedisServer, pg_url


async def _mixed_load(api: Api, keys: list[str], rounds: int) -> Counter[int]:
    statuses: Counter[int] = Counter()
    headers = {"Authorization": f"Bearer {api.api_key}"}
    async with aiohttp.ClientSession(
        api.base_url, headers=headers, connector=aiohttp.TCPConnector(limit=40)
    ) as client:

        async def one(rng: random.Random) -> None:
            key = rng.choice(keys)
            if rng.random() < 0.7:
                request = client.post(
                    "/v1/transactions",
                    json=body(terminal_id="T-REDIS", amount=77),
                    headers={"Idempotency-Key": key},
                )
            else:
                request = client.get(f"/v1/transactions/{key}")
            async with request as response:
                await response.read()
                statuses[response.status] += 1

        for round_no in range(rounds):
            rng = random.Random(round_no)
            await asyncio.gather(*(one(rng) for _ in range(60)))
    return statuses


def test_redis_killed_and_flushed_mid_run_changes_nothing(
    pg_backend: Backend, private_redis: RedisServer
) -> None:
    server = pg_backend.server(IDEMPAY_REDIS_URL=private_redis.url)
    api = Api(server.url, pg_backend.api_key("merchant-redis-chaos"))
    keys = [str(uuid.uuid4()) for _ in range(150)]
    try:
        before = asyncio.run(_mixed_load(api, keys, 5))
        redis.Redis.from_url(private_redis.url).flushall()
        flushed = asyncio.run(_mixed_load(api, keys, 5))
        private_redis.kill()
        down = asyncio.run(_mixed_load(api, keys, 5))
        with api.client() as client:
            ready = client.get("/readyz")
        assert ready.status_code == 200
        assert ready.json() == {"status": "degraded", "checks": {"database": "ok", "redis": "down"}}
        private_redis.start()  # same port: the pool reconnects
        deadline = time.monotonic() + 15
        while api.client().get("/readyz").json()["status"] != "ok":
            assert time.monotonic() < deadline, "readiness did not recover"
            time.sleep(0.2)
        after = asyncio.run(_mixed_load(api, keys, 5))
    finally:
        server.stop()
    for phase in (before, flushed, down, after):
        assert set(phase) <= {200, 201, 404, 409}, phase  # never a 5xx
    charges = pg_backend.sql(
        "SELECT transaction_id, count(*) FROM ledger_entry WHERE kind = 'charge' "
        "AND transaction_id IN (SELECT id FROM \"transaction\" WHERE terminal_id = 'T-REDIS') "
        "GROUP BY transaction_id"
    )
    assert charges and all(count == 1 for _, count in charges)


def test_cached_replay_checks_the_fingerprint(
    pg_backend: Backend, private_redis: RedisServer
) -> None:
    """With the database cut off, only the cache can answer: it replays the same body and
    refuses a different one (422), never serving the stored response for it."""
    forwarder = Forwarder("127.0.0.1", 5432).start()
    database = (pg_backend.database_url or "").rsplit("/", 1)[1]
    url = pg_url(database).replace("127.0.0.1:5432", f"127.0.0.1:{forwarder.port}")
    server = pg_backend.server(
        IDEMPAY_DATABASE_URL=url, IDEMPAY_REDIS_URL=private_redis.url, IDEMPAY_DB_TIMEOUT="1"
    )
    api = Api(server.url, pg_backend.api_key("merchant-redis-cache"))
    key = new_key()
    try:
        first = api.create(key, body(amount=500))
        assert first.status_code == 201
        forwarder.pause()
        replay = api.create(key, body(amount=500))
        assert replay.status_code == 201 and replay.content == first.content
        assert replay.headers["idempotent-replayed"] == "true"
        reused = api.create(key, body(amount=501))
        assert_problem(reused, 422, "idempotency_key_reused")
        lookup = api.lookup(key)
        assert lookup.status_code == 200 and lookup.json()["amount"] == 500
        assert_problem(api.create(new_key()), 503, "service_unavailable")  # proof: DB is away
    finally:
        forwarder.resume()
        server.stop()
        forwarder.stop()


def test_lookup_cache_is_dropped_by_a_reversal(
    pg_backend: Backend, private_redis: RedisServer
) -> None:
    server = pg_backend.server(IDEMPAY_REDIS_URL=private_redis.url)
    api = Api(server.url, pg_backend.api_key("merchant-redis-reversal"))
    try:
        key = new_key()
        api.create(key)
        assert api.lookup(key).json()["status"] == "approved"  # now cached
        assert api.reverse(key).json()["status"] == "reversed"
        assert api.lookup(key).json()["status"] == "reversed"
        client = redis.Redis.from_url(private_redis.url)
        ttls = [client.ttl(name) for name in client.scan_iter("*")]
        assert ttls and all(ttl > 0 for ttl in ttls), ttls  # every Redis key has a TTL
    finally:
        server.stop()
