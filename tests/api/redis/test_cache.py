"""Redis is advisory (contract §3.4): killed or flushed mid-run, every guarantee still holds;
a cached answer is never served for a different payload."""

from __future__ import annotations

import asyncio
import contextlib
import random
import shutil
import subprocess
import threading
import uuid
from collections import Counter
from pathlib import Path

import aiohttp
import httpx
import redis

from tests.support.backend import Backend
from tests.support.client import Api, assert_problem, body, card, new_key
from tests.support.eventually import eventually
from tests.support.forwarder import Forwarder
from tests.support.services import RedisServer, api_command, pg_url


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


def _readiness(api: Api) -> dict[str, object]:
    with api.client() as client:
        return client.get("/readyz").json()  # type: ignore[no-any-return]


def _wait_until_ready(api: Api) -> None:
    eventually(
        lambda: _readiness(api),
        until=lambda ready: ready["status"] == "ok",
        what="readiness to recover once Redis is back",
        timeout=15,
    )


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
        _wait_until_ready(api)
        after = asyncio.run(_mixed_load(api, keys, 5))
    finally:
        server.stop()
    for phase in (before, flushed, down, after):
        # never a 5xx; 202: a create whose 0210 came after the answer time on a loaded machine
        assert set(phase) <= {200, 201, 202, 404, 409}, phase
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


def test_a_reversal_with_redis_down_is_reversed_and_never_contradicted_after(
    pg_backend: Backend, private_redis: RedisServer
) -> None:
    """Redis is advisory (§3.4): with it down a reversal still reverses (200), and once it is
    back no server answers the "approved" its create had cached (§3.7)."""
    server = pg_backend.server(IDEMPAY_REDIS_URL=private_redis.url)
    api = Api(server.url, pg_backend.api_key("merchant-redis-down-reversal"))
    try:
        key = new_key()
        assert api.create(key).status_code == 201
        assert api.lookup(key).json()["status"] == "approved"  # cached in Redis
        private_redis.kill()
        reversed_ = api.reverse(key)
        assert reversed_.status_code == 200, reversed_.text
        assert reversed_.json()["status"] == "reversed"
        assert api.lookup(key).json()["status"] == "reversed"
        private_redis.start()  # same port: the pool reconnects
        _wait_until_ready(api)
        for _ in range(3):
            assert api.lookup(key).json()["status"] == "reversed"
    finally:
        server.stop()


# ------------------------------------------------------------ issue 14, items 3 and smaller
def _backup(backend: Backend, where: Path) -> None:
    if backend.name == "postgres":
        database = (backend.database_url or "").rsplit("/", 1)[1]
        subprocess.run(
            ["pg_dump", "-h", "127.0.0.1", "-U", "postgres", "-Fc", "-f", str(where), database],
            check=True,
        )
    else:  # the embedded database is one file (the server is stopped: no WAL pending)
        shutil.copyfile(backend.tmp / "var" / "idempay.db", where)


def _restore(backend: Backend, where: Path) -> None:
    if backend.name == "postgres":
        database = (backend.database_url or "").rsplit("/", 1)[1]
        subprocess.run(
            ["pg_restore", "-h", "127.0.0.1", "-U", "postgres", "--clean", "--if-exists",
             "--single-transaction", "-d", database, str(where)],
            check=True,
        )  # fmt: skip
    else:
        var = backend.tmp / "var"
        for leftover in ("idempay.db-wal", "idempay.db-shm"):
            (var / leftover).unlink(missing_ok=True)
        shutil.copyfile(where, var / "idempay.db")


def _new_epoch(backend: Backend, **extra: str) -> subprocess.CompletedProcess[str]:
    return api_command(["admin", "new-epoch"], {**backend.env, **extra}, timeout=60)


def test_a_restored_database_is_never_contradicted_by_redis(
    private_backend: Backend, private_redis: RedisServer, tmp_path: Path
) -> None:
    """Issue 14, item 3: back up, approve K (cached in Redis), restore the backup, renew
    the epoch, retry K with Redis kept: the cache from before the restore must not answer —
    the lookup says 404 and the retry is processed (once) against the restored database."""
    backend = private_backend
    api_key = backend.api_key("merchant-restore")
    backup = tmp_path / "backup"
    _backup(backend, backup)
    server = backend.server(IDEMPAY_REDIS_URL=private_redis.url)
    api = Api(server.url, api_key)
    key = new_key()
    try:
        first = api.create(key)
        assert first.status_code == 201 and first.json()["status"] == "approved"
        assert api.lookup(key).status_code == 200  # cached: create primes the lookup cache
    finally:
        server.stop()
    _restore(backend, backup)
    assert backend.sql("SELECT count(*) FROM idempotency_key")[0][0] == 0
    renewed = _new_epoch(backend)

    server = backend.server(IDEMPAY_REDIS_URL=private_redis.url)
    api = Api(server.url, api_key)
    try:
        assert_problem(api.lookup(key), 404, "not_found")
        retry = api.create(key)
        assert retry.status_code == 201, retry.text
        assert "idempotent-replayed" not in retry.headers
        assert retry.headers["idempotency-status"] == "created"
    finally:
        server.stop()
    charges = backend.sql(
        "SELECT count(*) FROM ledger_entry WHERE transaction_id = :k AND kind = 'charge'", k=key
    )
    assert charges[0][0] == 1
    assert renewed.returncode == 0, renewed.stderr
    assert "epoch" in renewed.stdout


def test_a_restore_under_running_servers_is_never_contradicted_by_redis(
    private_pg_backend: Backend, private_redis: RedisServer
) -> None:
    """The hostile review's R1: servers left running through a restore kept serving the old
    epoch's answers for up to 5 s after `idempay admin new-epoch` (the epoch was re-read in
    the background). new-epoch now announces the epoch in Redis, and a cache read that meets
    another epoch serves nothing: the very first request after it asks the database."""
    backend = private_pg_backend
    api_key = backend.api_key("merchant-live-restore")
    server = backend.server(IDEMPAY_REDIS_URL=private_redis.url)
    api = Api(server.url, api_key)
    key = new_key()
    try:
        assert api.create(key).status_code == 201
        assert api.lookup(key).status_code == 200  # the create and the lookup are cached
        for table, column in (
            ("ledger_entry", "transaction_id"),
            ("outbox_event", "transaction_id"),
            ('"transaction"', "id"),
            ("idempotency_key", "key"),
        ):  # what restoring a backup taken before K does to K
            backend.sql(f"DELETE FROM {table} WHERE {column} = :k", k=key)
        renewed = _new_epoch(backend, IDEMPAY_REDIS_URL=private_redis.url)
        assert renewed.returncode == 0, renewed.stderr
        assert "Redis told" in renewed.stdout
        assert_problem(api.lookup(key), 404, "not_found")
        retry = api.create(key)
    finally:
        server.stop()
    assert retry.status_code == 201, retry.text
    assert retry.headers["idempotency-status"] == "created"
    charges = backend.sql(
        "SELECT count(*) FROM ledger_entry WHERE transaction_id = :k AND kind = 'charge'", k=key
    )
    assert charges[0][0] == 1


def test_a_leftover_busy_marker_does_not_hide_a_fence(
    private_pg_backend: Backend, private_redis: RedisServer
) -> None:
    """The server that claimed K (and marked it busy in Redis) is killed mid issuer call;
    another server's abort fences K. A retry of K must get 410 transaction_aborted, not a
    409 from the dead server's busy marker (which lives as long as the lease)."""
    backend = private_pg_backend
    env = {
        "IDEMPAY_REDIS_URL": private_redis.url,
        "IDEMPAY_LEASE_SECONDS": "120",  # the busy marker outlives the whole test
        "IDEMPAY_ANSWER_WITHIN": "30",  # the first server is killed long before this
    }
    first = backend.server(**env)
    api = Api(first.url, backend.api_key("merchant-busy"))
    key = new_key()
    payment = body(card=card("tok_issuer_down"))
    sender = threading.Thread(target=lambda: _swallow(api, key, payment), daemon=True)
    sender.start()
    client = redis.Redis.from_url(private_redis.url)
    eventually(
        lambda: any(key in name.decode() for name in client.scan_iter("*busy*")),
        what="the claim to mark the key busy in Redis",
        timeout=30,
    )
    first.kill()
    sender.join(30)

    second = backend.server(**{**env, "IDEMPAY_ANSWER_WITHIN": "0.5"})
    api = Api(second.url, api.api_key)
    try:
        assert any(key in name.decode() for name in client.scan_iter("*busy*"))
        abort = eventually(
            lambda: api.abort(key),
            until=lambda answer: answer.status_code != 409,  # the grace after the claim
            what="the abort to be answered other than 409",
            timeout=30,
        )
        assert abort.json()["status"] == "aborted", abort.text
        assert_problem(api.create(key, payment), 410, "transaction_aborted")
    finally:
        second.stop()


def _swallow(api: Api, key: str, payment: dict[str, object]) -> None:
    with contextlib.suppress(httpx.HTTPError):
        api.create(key, payment)
