"""A cached answer never outlives a reversal (contract §3.7; issue 14, item 4).

The race: a writer reads "approved" from the database, a reversal commits and clears the
cache, then the writer's cache write lands — and every lookup says approved while the
database says reversed. Two writers can do it: a lookup's cache fill, and the create's
after-commit write (which primes the lookup cache).

These tests hold the writer between its database read and its Redis write (the write
itself still runs, on a real redis-server), run the reversal in that gap, then let the
write land: the interleaving is exact, not a matter of timing.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from api.acquirer.runtime import AcquirerRuntime
from api.config import Settings
from api.db import create_engine
from api.idempotency.cache import ResponseCache
from api.idempotency.keys import body_fingerprint
from api.transactions import resolution
from api.transactions.schemas import TransactionCreate
from api.transactions.service import TransactionService
from tests.support.backend import Backend
from tests.support.client import body
from tests.support.services import RedisServer


class HeldCache(ResponseCache):
    """The real cache, except that the first write of the held kind waits at the door."""

    def __init__(self, *args: Any, hold: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hold = hold
        self.reached = asyncio.Event()
        self.release = asyncio.Event()

    async def _held(self) -> None:
        if self.hold and not self.reached.is_set():
            self.reached.set()
            await self.release.wait()

    async def put_lookup(self, *args: Any, **kwargs: Any) -> None:
        if self.hold == "lookup":
            await self._held()
        await super().put_lookup(*args, **kwargs)

    async def put_response(self, *args: Any, **kwargs: Any) -> None:
        if self.hold == "response":
            await self._held()
        await super().put_response(*args, **kwargs)


@pytest.fixture
async def make_service(backend: Backend, private_redis: RedisServer) -> AsyncIterator[Any]:
    settings = Settings(
        database_url=backend.database_url,
        var_dir=backend.tmp / "var",
        db_pool_size=2,  # Postgres is shared
        redis_url=private_redis.url,
    )
    engine = create_engine(settings)
    acquirer = await AcquirerRuntime.open(settings)  # a child acquirer host, as serve starts
    client = aioredis.Redis.from_url(private_redis.url)

    def make(hold: str) -> TransactionService:
        cache = HeldCache(
            client, prefix="idempay:", ttl=3600, lookup_ttl=3600, busy_ttl=30, hold=hold
        )
        return TransactionService(engine, acquirer.link, settings, cache=cache)

    try:
        yield make
    finally:
        await client.aclose()
        await acquirer.close()
        await engine.dispose()


def _payment() -> TransactionCreate:
    return TransactionCreate.model_validate(body())


async def _wait(event: asyncio.Event) -> None:
    async with asyncio.timeout(30):
        await event.wait()


def _racing(make_service: Any, where: str) -> tuple[Any, HeldCache, str, str, TransactionCreate]:
    """A service whose cache holds its ``where`` write, and a new merchant, key and payment."""
    service = make_service(where)
    merchant, key, payment = f"mer_race_{uuid.uuid4().hex[:10]}", str(uuid.uuid4()), _payment()
    return service, service.cache, merchant, key, payment


async def _reversed_while_the_write_is_held(
    service: Any, cache: HeldCache, merchant: str, key: str
) -> None:
    """Once the cache write is held (``cache.reached``), the key reversed; then the write
    released."""
    await _wait(cache.reached)
    reversed_ = await resolution.reverse(service, merchant, key)
    assert reversed_.status == 200 and b'"status":"reversed"' in reversed_.body
    cache.release.set()


async def _served_reversed(service: Any, merchant: str, key: str) -> None:
    """A lookup now answers the reversed transaction (no stale "approved" from the cache)."""
    after = await resolution.lookup(service, merchant, key)
    assert after.status == 200
    assert b'"status":"reversed"' in after.body, after.body


async def test_a_lookup_cache_write_that_raced_a_reversal_never_serves_approved(
    make_service: Any,
) -> None:
    service, cache, merchant, key, payment = _racing(make_service, "lookup")
    created = await service.create(merchant, key, payment, body_fingerprint(payment))
    assert created.status == 201
    await cache.drop_lookup(merchant, key)  # the next lookup fills the cache from the database

    lookup = asyncio.create_task(resolution.lookup(service, merchant, key))
    # it read "approved" and is about to write it to Redis
    await _reversed_while_the_write_is_held(service, cache, merchant, key)
    assert (await lookup).status == 200  # the lookup itself answered before the reversal
    await _served_reversed(service, merchant, key)


async def test_the_creates_after_commit_write_that_raced_a_reversal_never_serves_approved(
    make_service: Any,
) -> None:
    service, cache, merchant, key, payment = _racing(make_service, "response")

    create = asyncio.create_task(service.create(merchant, key, payment, body_fingerprint(payment)))
    # committed "approved", about to remember it in Redis
    await _reversed_while_the_write_is_held(service, cache, merchant, key)
    assert (await create).status == 201
    await _served_reversed(service, merchant, key)
