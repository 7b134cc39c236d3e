"""A restore under a running server is never contradicted by Redis, whatever the timing
(contract §3.6).

A server re-reads the database's epoch in the background (every few seconds) and after
`idempay admin new-epoch` announces a new one in Redis. These tests put that re-read, or a
restore with its new-epoch, exactly where a request was between two of its steps, on a real
Postgres and a real redis-server:

- a cache read built its keys under the old epoch; the re-read binds the new one before the
  answer comes back. The marker (the new epoch) must be checked against the epoch the keys
  were built with — checked against the one bound meanwhile, it vouched for the old epoch's
  entry, and the lookup answered 200 with the deleted transaction (the one unexplained
  failure of ``test_a_restore_under_running_servers_is_never_contradicted_by_redis``);
- a cache write of an answer read (or committed) before the restore lands after the server
  bound the new epoch: it must be stored under the epoch known before its database access,
  never under the new one.

The last test is the CI failure itself, end to end: a real server whose Redis answers 0.1 s
late (a proxy), so the epoch re-read the lookup starts (past ``EPOCH_RECHECK_SECONDS``)
lands while its MGET is out — under CPU load a Redis descheduled for a moment did the same.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis

from api.config import Settings
from api.db import create_engine
from api.events.writer import RequestOutcome
from api.idempotency.cache import ResponseCache
from api.idempotency.keys import body_fingerprint
from api.transactions import resolution
from api.transactions.schemas import TransactionCreate
from api.transactions.service import EPOCH_RECHECK_SECONDS, TransactionService
from tests.support.backend import Backend
from tests.support.client import Api, body, new_key
from tests.support.services import RedisServer, api_command
from tests.support.transaction_service import ApprovingAcquirer

# What restoring a backup taken before the key does to it (as in test_cache.py).
RESTORED_AWAY = (
    ("ledger_entry", "transaction_id"),
    ("outbox_event", "transaction_id"),
    ('"transaction"', "id"),
    ("idempotency_key", "key"),
)


class Door:
    """Where a request waits, once: ``reached`` when it got there, then ``release``."""

    def __init__(self) -> None:
        self.armed = False
        self.reached = asyncio.Event()
        self.release = asyncio.Event()

    async def pass_through(self) -> None:
        if self.armed:
            self.armed = False
            self.reached.set()
            await self.release.wait()

    async def reached_in_time(self) -> None:
        async with asyncio.timeout(30):
            await self.reached.wait()


class HeldRedis:
    """The real Redis client, except that an armed ``reads`` door holds the next MGET (a
    cache read: the key's entries beside the epoch marker) after its keys were built, before
    it is sent."""

    def __init__(self, client: aioredis.Redis) -> None:
        self._client = client
        self.reads = Door()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    async def mget(self, *names: Any) -> Any:
        await self.reads.pass_through()
        return await self._client.mget(*names)


class HeldCache(ResponseCache):
    """The real cache, except that an armed ``writes`` door holds the next put of an answer
    (the lookup's fill, the create's after-commit write) before it reaches Redis."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.writes = Door()

    async def put_lookup(self, *args: Any, **kwargs: Any) -> None:
        await self.writes.pass_through()
        await super().put_lookup(*args, **kwargs)

    async def put_response(self, *args: Any, **kwargs: Any) -> None:
        await self.writes.pass_through()
        await super().put_response(*args, **kwargs)


class Live:
    """A running server's service (its cache on the private Redis), and what an operator
    does to its database meanwhile."""

    def __init__(
        self, backend: Backend, redis_url: str, service: TransactionService, redis: HeldRedis
    ) -> None:
        self.backend = backend
        self.redis_url = redis_url
        self.service = service
        self.redis = redis
        self.merchant = f"mer_epoch_{uuid.uuid4().hex[:10]}"
        self.key = str(uuid.uuid4())
        self.payment = TransactionCreate.model_validate(body())

    @property
    def cache(self) -> HeldCache:
        assert isinstance(self.service.cache, HeldCache)
        return self.service.cache

    async def create(self) -> Any:
        fingerprint = body_fingerprint(self.payment)
        return await self.service.create(self.merchant, self.key, self.payment, fingerprint)

    async def lookup(self) -> Any:
        return await resolution.lookup(self.service, self.merchant, self.key)

    async def restore_and_renew(self) -> str:
        """The key's rows gone (a restore), then ``idempay admin new-epoch`` told Redis: the
        new epoch."""
        for table, column in RESTORED_AWAY:
            statement = f"DELETE FROM {table} WHERE {column} = :k"
            await asyncio.to_thread(self.backend.sql, statement, k=self.key)
        env = {**self.backend.env, "IDEMPAY_REDIS_URL": self.redis_url}
        done = await asyncio.to_thread(api_command, ["admin", "new-epoch"], env, timeout=60)
        assert done.returncode == 0, done.stderr
        assert "Redis told" in done.stdout, done.stdout
        return done.stdout.split("new epoch: ", 1)[1].split()[0]

    async def rebind(self, new: str) -> None:
        """The server's periodic re-read of the epoch (``refresh_epoch``'s background task),
        landing now."""
        await self.service.bind_epoch()
        assert self.cache.epoch == new


@pytest.fixture
async def live(private_pg_backend: Backend, private_redis: RedisServer) -> AsyncIterator[Live]:
    backend = private_pg_backend
    settings = Settings(
        database_url=backend.database_url,
        var_dir=backend.tmp / "var",
        db_pool_size=2,
        redis_url=private_redis.url,
        # a create held at its cache write while `admin new-epoch` (a CLI start) runs must
        # still answer 201 on a loaded machine, not 202 at the default 5 s answer time
        answer_within=60.0,
    )
    engine = create_engine(settings)
    client = aioredis.Redis.from_url(private_redis.url)
    redis = HeldRedis(client)
    cache = HeldCache(redis, prefix=settings.redis_prefix, ttl=3600, lookup_ttl=3600, busy_ttl=30)
    service = TransactionService(engine, ApprovingAcquirer(), settings, cache=cache)
    try:
        yield Live(backend, private_redis.url, service, redis)
    finally:
        await client.aclose()
        await engine.dispose()


async def _created_and_cached(live: Live) -> None:
    created = await live.create()
    assert created.status == 201 and created.event == RequestOutcome.CREATED
    assert (await live.lookup()).status == 200  # the create primed the lookup cache


async def _read_across_the_rebind(live: Live, request: Callable[[], Awaitable[Any]]) -> Any:
    """``request`` after the restore and new-epoch, its cache read held after its keys were
    built (under the old epoch) while the server re-reads the epoch; then let through."""
    new = await live.restore_and_renew()
    live.redis.reads.armed = True
    answer = asyncio.create_task(request())
    await live.redis.reads.reached_in_time()
    await live.rebind(new)
    live.redis.reads.release.set()
    return await answer


async def test_a_lookup_whose_cache_read_straddles_the_epoch_re_read_asks_the_database(
    live: Live,
) -> None:
    await _created_and_cached(live)
    answer = await _read_across_the_rebind(live, live.lookup)
    assert answer.status == 404, answer.body  # the restored database has no such key


async def test_a_retry_whose_cache_read_straddles_the_epoch_re_read_is_processed_again(
    live: Live,
) -> None:
    await _created_and_cached(live)
    retry = await _read_across_the_rebind(live, live.create)
    assert retry.status == 201, retry.body
    assert retry.event == RequestOutcome.CREATED  # processed against the restored database


async def test_a_lookup_fill_read_before_a_restore_is_not_stored_under_the_new_epoch(
    live: Live,
) -> None:
    await _created_and_cached(live)
    await live.cache.drop_lookup(live.merchant, live.key)  # the next lookup fills the cache
    live.cache.writes.armed = True
    first = asyncio.create_task(live.lookup())
    await live.cache.writes.reached_in_time()  # it read "approved" from the database
    await live.rebind(await live.restore_and_renew())
    live.cache.writes.release.set()
    assert (await first).status == 200  # answered from the database before the restore
    after = await live.lookup()
    assert after.status == 404, after.body


async def test_a_create_committed_before_a_restore_is_not_cached_under_the_new_epoch(
    live: Live,
) -> None:
    live.cache.writes.armed = True
    create = asyncio.create_task(live.create())
    await live.cache.writes.reached_in_time()  # committed, about to remember it in Redis
    await live.rebind(await live.restore_and_renew())
    live.cache.writes.release.set()
    assert (await create).status == 201
    after = await live.lookup()
    assert after.status == 404, after.body
    retry = await live.create()
    assert retry.status == 201 and retry.event == RequestOutcome.CREATED, retry.body


async def test_a_replay_read_before_a_restore_is_not_cached_under_the_new_epoch(
    live: Live, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A retry that read its completed key from the database just before a restore, and
    whose replay is remembered after the server bound the new epoch: it is cached under the
    epoch taken before its read, so the next retry is processed against the restored
    database, not replayed from Redis."""
    await _created_and_cached(live)
    # the cached replay gone: the next retry reads the key from the database
    await live.redis.delete(live.cache._key("resp", live.merchant, live.key))
    held = Door()
    held.armed = True
    read = live.service.read

    async def read_then_wait(merchant_id: str, key: str) -> Any:
        record = await read(merchant_id, key)
        await held.pass_through()
        return record

    monkeypatch.setattr(live.service, "read", read_then_wait)
    retry = asyncio.create_task(live.create())
    await held.reached_in_time()  # it read the completed key (before the restore)
    await live.rebind(await live.restore_and_renew())
    held.release.set()
    first = await retry
    assert first.status == 201 and first.event == RequestOutcome.REPLAYED, first.body
    again = await live.create()
    assert again.status == 201, again.body
    assert again.event == RequestOutcome.CREATED  # processed against the restored database


class SlowRedis:
    """A TCP proxy in front of a Redis whose answers each arrive ``delay`` seconds late
    (below the server's Redis timeout, so the cache stays on)."""

    def __init__(self, redis: RedisServer, delay: float) -> None:
        self.target, self.delay = redis.port, delay
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None

    def __enter__(self) -> SlowRedis:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.url = f"redis://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/0"

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, late: float) -> None:
            try:
                while data := await src.read(65536):
                    await asyncio.sleep(late)
                    dst.write(data)
                    await dst.drain()
            finally:
                dst.close()

        await asyncio.gather(
            pipe(reader, up_writer, 0.0),
            pipe(up_reader, writer, self.delay),
            return_exceptions=True,
        )


def test_a_running_server_whose_redis_answers_late_never_serves_a_restored_away_key(
    private_pg_backend: Backend, private_redis: RedisServer
) -> None:
    """test_cache.py's restore under a running server, with the lookup after new-epoch past
    the epoch's recheck: the re-read it starts (Postgres) answers before its MGET (Redis).
    Before the fix: 200 with the deleted transaction."""
    backend = private_pg_backend
    with SlowRedis(private_redis, delay=0.1) as slow:
        server = backend.server(IDEMPAY_REDIS_URL=slow.url)
        api = Api(server.url, backend.api_key("merchant-late-redis"))
        key = new_key()
        try:
            created_at = time.monotonic()
            assert api.create(key).status_code == 201
            assert api.lookup(key).status_code == 200  # the create and the lookup are cached
            for table, column in RESTORED_AWAY:
                backend.sql(f"DELETE FROM {table} WHERE {column} = :k", k=key)
            env = {**backend.env, "IDEMPAY_REDIS_URL": private_redis.url}
            renewed = api_command(["admin", "new-epoch"], env, timeout=60)
            assert "Redis told" in renewed.stdout, renewed.stdout + renewed.stderr
            # the server's epoch is due for its re-read (the create's request bound it)
            time.sleep(max(0.0, created_at + EPOCH_RECHECK_SECONDS + 0.5 - time.monotonic()))
            after = api.lookup(key)
        finally:
            server.stop()
    assert after.status_code == 404, after.text
