"""A cached lookup never outlives a reversal, even when Redis fails the reversing server
(contract §3.4 with §3.7), on a real Postgres and a real redis-server, two servers' services
on one database.

A reversal marks the key's lookup entry "reversing" before it commits, so no writer holding
an older "approved" can make the cache answer it afterwards. That mark is the only thing that
stands between the commit and an "approved" entry already in Redis: a reversal that commits
without it (its Redis call timed out, the server's circuit opened) leaves the other servers
answering "approved" from Redis, for the lookup TTL, about a transaction the database says is
reversed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import TimeoutError as RedisTimeout

from api.config import Settings
from api.db import create_engine
from api.events.writer import RequestOutcome
from api.idempotency.cache import ResponseCache
from api.idempotency.keys import body_fingerprint
from api.transactions import resolution
from api.transactions import service as service_module
from api.transactions.schemas import TransactionCreate
from api.transactions.service import TransactionService
from tests.support.backend import Backend
from tests.support.client import body
from tests.support.services import RedisServer
from tests.support.transaction_service import ApprovingAcquirer


class FlakyRedis:
    """The real Redis client, except that its next ``failing`` EVALs (the reversal's mark,
    a cache write) time out, as a Redis answering later than ``IDEMPAY_REDIS_TIMEOUT``."""

    def __init__(self, client: aioredis.Redis) -> None:
        self._client = client
        self.failing = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    async def eval(self, *args: Any) -> Any:
        if self.failing:
            self.failing -= 1
            raise RedisTimeout("Timeout reading from socket")
        return await self._client.eval(*args)


class Pair:
    def __init__(self, a: TransactionService, b: TransactionService, flaky: FlakyRedis) -> None:
        self.a, self.b, self.flaky_a = a, b, flaky
        self.merchant = f"mer_hostile_{uuid.uuid4().hex[:10]}"


@contextlib.asynccontextmanager
async def _pair(backend: Backend, redis_url: str) -> AsyncIterator[Pair]:
    settings = Settings(
        database_url=backend.database_url,
        var_dir=backend.tmp / "var",
        db_pool_size=2,
        redis_url=redis_url,
        answer_within=60.0,  # a create held at its cache write still answers 201 (loaded CI)
    )
    engines, clients, services, flaky = [], [], [], []
    for _ in range(2):
        engine = create_engine(settings)
        client = aioredis.Redis.from_url(redis_url)
        wrapped = FlakyRedis(client)
        cache = ResponseCache(
            wrapped, prefix=settings.redis_prefix, ttl=3600, lookup_ttl=3600, busy_ttl=3600
        )
        engines.append(engine)
        clients.append(client)
        flaky.append(wrapped)
        services.append(TransactionService(engine, ApprovingAcquirer(), settings, cache=cache))
    try:
        yield Pair(services[0], services[1], flaky[0])
    finally:
        for client in clients:
            await client.aclose()
        for engine in engines:
            await engine.dispose()


async def _created_and_cached(pair: Pair) -> str:
    """A sale created on b (priming b's lookup cache with "approved"), looked up on b, and a
    bound to the same epoch."""
    key = str(uuid.uuid4())
    payment = TransactionCreate.model_validate(body())
    created = await pair.b.create(pair.merchant, key, payment, body_fingerprint(payment))
    assert created.status == 201 and created.event == RequestOutcome.CREATED, created.body
    seen = await resolution.lookup(pair.b, pair.merchant, key)
    assert seen.status == 200 and json.loads(seen.body)["status"] == "approved"
    assert await pair.a.bind_epoch() == pair.b.cache.epoch
    return key


def _status(outcome: Any) -> str:
    assert outcome.status == 200, (outcome.status, outcome.body)
    return str(json.loads(outcome.body)["status"])


async def test_a_reversal_whose_mark_timed_out_once_is_not_outlived_by_the_cache(
    private_pg_backend: Backend, private_redis: RedisServer
) -> None:
    """The reversing server's Redis call for the mark times out once (a Redis late under
    load): its circuit opens, and before it also skipped its reversed entry after the commit.
    Before: the reversal answered "reversed" and the other server kept answering "approved"
    from Redis."""
    async with _pair(private_pg_backend, private_redis.url) as pair:
        key = await _created_and_cached(pair)
        pair.flaky_a.failing = 1
        assert _status(await resolution.reverse(pair.a, pair.merchant, key)) == "reversed"
        for server in (pair.b, pair.a):
            assert _status(await resolution.lookup(server, pair.merchant, key)) == "reversed"


async def test_a_reversal_that_cannot_mark_the_cache_renews_the_epoch(
    private_pg_backend: Backend, private_redis: RedisServer
) -> None:
    """Redis unreachable from the reversing server (a partition; the other server still
    reaches it): the reversal cannot take the "approved" entry back. Redis is advisory, so
    the reversal commits all the same (contract §3.4) — and renews the database's epoch in
    its transaction, so the "approved" cached before it is never served again once a server
    has re-read the epoch (§3.6, §3.7): the reversing server at once, the other at its
    periodic re-read. Before: the other server answered "approved" from Redis for the lookup
    cache's TTL."""
    async with _pair(private_pg_backend, private_redis.url) as pair:
        key = await _created_and_cached(pair)
        old = pair.b.cache.epoch
        pair.flaky_a.failing = 100
        assert _status(await resolution.reverse(pair.a, pair.merchant, key)) == "reversed"
        new = pair.a.cache.epoch
        assert new is not None and new != old  # renewed with the reversal, bound at once
        assert _status(await resolution.lookup(pair.a, pair.merchant, key)) == "reversed"
        assert await pair.b.bind_epoch() == new  # the other server's periodic re-read
        assert _status(await resolution.lookup(pair.b, pair.merchant, key)) == "reversed"
        pair.flaky_a.failing = 0
        await asyncio.sleep(1.1)  # the circuit the failures opened closes again
        for server in (pair.b, pair.a):
            assert _status(await resolution.lookup(server, pair.merchant, key)) == "reversed"
        # a second reversal of it is answered as before and renews nothing
        assert _status(await resolution.reverse(pair.a, pair.merchant, key)) == "reversed"
        assert pair.a.cache.epoch == new


async def _flushed_and_announced_again(pair: Pair, redis_url: str) -> None:
    """Redis flushed (FLUSHALL: the reversal's mark and entry gone with the rest), then the
    same epoch announced again by the next server that re-reads it."""
    client = aioredis.Redis.from_url(redis_url)
    try:
        await client.flushall()
    finally:
        await client.aclose()
    epoch = pair.b.cache.epoch
    assert await pair.b.bind_epoch() == epoch  # announced anew (the marker was missing)


async def test_a_lookup_answer_read_before_a_reversal_and_a_flush_is_not_cached_after_them(
    private_pg_backend: Backend, private_redis: RedisServer, monkeypatch: Any
) -> None:
    """A lookup reads "approved" from the database; before its cache write lands the key is
    reversed (mark and entry in Redis), Redis is flushed and the same epoch announced again.
    Before: the held write landed "approved" where no mark stood any more, and every server
    answered "approved" about a reversed transaction for the lookup TTL (§3.4 with §3.7)."""
    async with _pair(private_pg_backend, private_redis.url) as pair:
        key = await _created_and_cached(pair)
        client = aioredis.Redis.from_url(private_redis.url)
        try:  # the lookup entry expired: a's lookup reads the database
            for name in [n async for n in client.scan_iter("*txn:*")]:
                await client.delete(name)
        finally:
            await client.aclose()
        read, release = asyncio.Event(), asyncio.Event()
        real = resolution._current

        async def held(service: Any, *args: Any) -> Any:
            answer = await real(service, *args)
            if service is pair.a and not read.is_set():
                read.set()
                await release.wait()
            return answer

        monkeypatch.setattr(resolution, "_current", held)
        looking = asyncio.create_task(resolution.lookup(pair.a, pair.merchant, key))
        try:
            async with asyncio.timeout(30):
                await read.wait()
            assert _status(await resolution.reverse(pair.b, pair.merchant, key)) == "reversed"
            await _flushed_and_announced_again(pair, private_redis.url)
        finally:
            release.set()
        assert _status(await looking) == "approved"  # what it read, before the reversal
        for server in (pair.b, pair.a):
            assert _status(await resolution.lookup(server, pair.merchant, key)) == "reversed"


async def test_a_creations_lookup_entry_held_past_a_reversal_and_a_flush_is_not_cached(
    private_pg_backend: Backend, private_redis: RedisServer, monkeypatch: Any
) -> None:
    """The create's own priming of the lookup cache ("approved", after its commit) is held;
    meanwhile the key is reversed, Redis flushed and the epoch announced again. Before: the
    priming landed "approved" and was served about a reversed transaction."""
    async with _pair(private_pg_backend, private_redis.url) as pair:
        await _created_and_cached(pair)  # both servers bound and announced
        committed, release = asyncio.Event(), asyncio.Event()
        real = pair.a.remember

        async def held(*args: Any, **kwargs: Any) -> None:
            committed.set()
            await release.wait()
            await real(*args, **kwargs)

        monkeypatch.setattr(pair.a, "remember", held)
        key = str(uuid.uuid4())
        payment = TransactionCreate.model_validate(body())
        creating = asyncio.create_task(
            pair.a.create(pair.merchant, key, payment, body_fingerprint(payment))
        )
        try:
            async with asyncio.timeout(30):
                await committed.wait()
            assert _status(await resolution.reverse(pair.b, pair.merchant, key)) == "reversed"
            await _flushed_and_announced_again(pair, private_redis.url)
        finally:
            release.set()
        created = await creating
        assert created.status == 201, created.body
        for server in (pair.b, pair.a):
            assert _status(await resolution.lookup(server, pair.merchant, key)) == "reversed"


async def test_a_marker_naming_another_epoch_is_re_read_once_per_interval_not_per_request(
    private_pg_backend: Backend, private_redis: RedisServer, monkeypatch: Any
) -> None:
    """A marker left naming an epoch the database no longer holds (a reversal that renewed
    the epoch while Redis was out of reach, a new-epoch whose announcement failed) stays
    until it expires or an operator announces again. Meanwhile the cache serves nothing —
    and, before, every request on every server read the database's epoch inline first."""
    async with _pair(private_pg_backend, private_redis.url) as pair:
        key = await _created_and_cached(pair)
        client = aioredis.Redis.from_url(private_redis.url)
        try:
            await client.set(pair.a.cache.epoch_marker, "an-epoch-long-gone:0123456789abcdef")
        finally:
            await client.aclose()
        reads = []
        real = service_module.read_epoch

        async def counted(conn: Any) -> str | None:
            reads.append(1)
            return await real(conn)

        monkeypatch.setattr(service_module, "read_epoch", counted)
        for _ in range(20):
            assert _status(await resolution.lookup(pair.a, pair.merchant, key)) == "approved"
        assert len(reads) <= 2, len(reads)  # one inline re-read (+ one announcement check)
