"""A reversal is never outlived by a cached lookup, whichever epoch the reversing server
still holds (contract §3.6 with §3.7).

After ``idempay admin new-epoch`` servers follow the new epoch at their own pace: a server
re-reads it in the background at most every few seconds, and only when a request comes
(``refresh_epoch``), so the first request after a quiet spell runs under the epoch it knew
before. A reversal reads no cache entry, so the epoch marker never tells it either. Its
"reversing" mark and its reversed entry must still land where the lookups are served from:
the database's epoch. Before: a server still on the old epoch marked only the old epoch's
entry, and a server already on the new one kept answering "approved" from the entry its
create primed, after the reversal had committed (for the lookup TTL).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from api.config import Settings
from api.db import create_engine
from api.events.writer import RequestOutcome
from api.idempotency.cache import ResponseCache
from api.idempotency.keys import body_fingerprint
from api.idempotency.store import KeyState
from api.transactions import resolution
from api.transactions import service as service_module
from api.transactions.schemas import TransactionCreate
from api.transactions.service import EPOCH_RECHECK_SECONDS, TransactionService
from tests.support.backend import Backend
from tests.support.client import body
from tests.support.services import RedisServer, api_command
from tests.support.transaction_service import ApprovingAcquirer

# What restoring a backup taken before the key does to it (as in test_cache.py).
RESTORED_AWAY = (
    ("ledger_entry", "transaction_id"),
    ("outbox_event", "transaction_id"),
    ('"transaction"', "id"),
    ("idempotency_key", "key"),
)


class Servers:
    """Two running servers' services on one database and one Redis."""

    def __init__(
        self, backend: Backend, redis_url: str, a: TransactionService, b: TransactionService
    ) -> None:
        self.backend = backend
        self.redis_url = redis_url
        self.a, self.b = a, b
        self.merchant = f"mer_review_{uuid.uuid4().hex[:10]}"

    async def new_epoch(self) -> str:
        env = {**self.backend.env, "IDEMPAY_REDIS_URL": self.redis_url}
        done = await asyncio.to_thread(api_command, ["admin", "new-epoch"], env, timeout=60)
        assert done.returncode == 0, done.stderr
        assert "Redis told" in done.stdout, done.stdout
        return done.stdout.split("new epoch: ", 1)[1].split()[0]


@contextlib.asynccontextmanager
async def _servers(
    backend: Backend, redis_url: str, acquirer_b: Any = None, **overrides: Any
) -> AsyncIterator[Servers]:
    settings = Settings(
        database_url=backend.database_url,
        var_dir=backend.tmp / "var",
        db_pool_size=2,
        redis_url=redis_url,
        # an epoch re-read held while `admin new-epoch` (a CLI start) runs must outlast it on
        # a loaded machine; past db_timeout the re-read gives up (None) instead of answering
        **{"db_timeout": 60.0, **overrides},
    )
    engines, clients, services = [], [], []
    for acquirer in (ApprovingAcquirer(), acquirer_b or ApprovingAcquirer()):
        engine = create_engine(settings)
        client = aioredis.Redis.from_url(redis_url)
        cache = ResponseCache(
            client, prefix=settings.redis_prefix, ttl=3600, lookup_ttl=3600, busy_ttl=3600
        )
        engines.append(engine)
        clients.append(client)
        services.append(TransactionService(engine, acquirer, settings, cache=cache))
    try:
        yield Servers(backend, redis_url, services[0], services[1])
    finally:
        for client in clients:
            await client.aclose()
        for engine in engines:
            await engine.dispose()


@pytest.fixture
async def servers(
    private_pg_backend: Backend, private_redis: RedisServer
) -> AsyncIterator[Servers]:
    async with _servers(private_pg_backend, private_redis.url) as both:
        yield both


def _hold_the_next_epoch_read(
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[asyncio.Event, asyncio.Event]:
    """The next database read of the epoch reads it, sets ``read`` and waits for ``late``
    before it answers (a slow periodic re-read); later reads are not held."""
    read, late = asyncio.Event(), asyncio.Event()
    real = service_module.read_epoch

    async def read_late(conn: Any) -> str | None:
        epoch = await real(conn)
        if not read.is_set():
            read.set()
            await late.wait()
        return epoch

    monkeypatch.setattr(service_module, "read_epoch", read_late)
    return read, late


def _announced_epoch(marker: bytes | None) -> str | None:
    """The epoch an epoch marker's value (``epoch:nonce``) announces."""
    return marker.decode().partition(":")[0] if marker is not None else None


async def _create(service: TransactionService, merchant: str, key: str) -> None:
    payment = TransactionCreate.model_validate(body())
    created = await service.create(merchant, key, payment, body_fingerprint(payment))
    assert created.status == 201 and created.event == RequestOutcome.CREATED, created.body


async def test_a_reversal_by_a_server_still_on_the_old_epoch_is_not_outlived_by_the_cache(
    servers: Servers,
) -> None:
    a, b, merchant = servers.a, servers.b, servers.merchant
    await _create(a, merchant, str(uuid.uuid4()))  # both servers know the epoch: bound
    await _create(b, merchant, str(uuid.uuid4()))
    old = a.cache.epoch
    new = await servers.new_epoch()
    await b.bind_epoch()  # b's periodic re-read has come; a's has not (within its seconds)
    assert (a.cache.epoch, b.cache.epoch) == (old, new)

    key = str(uuid.uuid4())
    await _create(b, merchant, key)  # primes the lookup cache under the new epoch
    seen = await resolution.lookup(b, merchant, key)
    assert seen.status == 200 and json.loads(seen.body)["status"] == "approved"

    reversed_ = await resolution.reverse(a, merchant, key)
    assert reversed_.status == 200 and json.loads(reversed_.body)["status"] == "reversed"

    for server in (b, a):
        after = await resolution.lookup(server, merchant, key)
        assert after.status == 200
        assert json.loads(after.body)["status"] == "reversed", after.body


async def test_old_entries_back_without_the_marker_are_not_served_to_a_server_on_the_old_epoch(
    servers: Servers,
) -> None:
    """Redis restarted from a snapshot taken before new-epoch (or failed over to a replica
    the marker had not reached): the old epoch's entries are back, the marker is not. A
    server idle past its recheck answers its first request under the epoch it knew (the
    re-read runs in the background). Before: 200 with the restored-away transaction."""
    a, merchant, key = servers.a, servers.merchant, str(uuid.uuid4())
    await _create(a, merchant, key)  # primes the lookup cache under the old epoch
    assert (await resolution.lookup(a, merchant, key)).status == 200
    for table, column in RESTORED_AWAY:
        await asyncio.to_thread(
            servers.backend.sql, f"DELETE FROM {table} WHERE {column} = :k", k=key
        )
    await servers.new_epoch()
    client = aioredis.Redis.from_url(servers.redis_url)
    try:
        assert await client.delete(a.cache.epoch_marker) == 1  # lost with the restart
    finally:
        await client.aclose()
    await asyncio.sleep(EPOCH_RECHECK_SECONDS + 0.5)  # a quiet spell: the epoch is due
    after = await resolution.lookup(a, merchant, key)
    assert after.status == 404, after.body
    await asyncio.sleep(0.5)  # the background re-read has bound the new epoch, announced it
    again = await resolution.lookup(a, merchant, key)
    assert again.status == 404, again.body


class HeldAcquirer(ApprovingAcquirer):
    """Holds every 0200 until ``release`` (an issuer that does not answer)."""

    def __init__(self) -> None:
        super().__init__()
        self.out = asyncio.Event()
        self.release = asyncio.Event()

    async def before_approval(self, req: Any) -> None:
        self.out.set()
        await self.release.wait()


async def test_a_fence_by_a_server_still_on_the_old_epoch_is_not_hidden_by_the_busy_hint(
    private_pg_backend: Backend, private_redis: RedisServer
) -> None:
    """A server on the new epoch claims K (its busy hint under the new epoch) and its 0200
    hangs; a server still on the old epoch aborts K. A retry of K must get 410, not the
    in-progress answer of the busy hint its fence left standing under the new epoch."""
    held = HeldAcquirer()
    async with _servers(private_pg_backend, private_redis.url, held, answer_within=0.5) as servers:
        a, b, merchant = servers.a, servers.b, servers.merchant
        await _create(a, merchant, str(uuid.uuid4()))  # both bound to the old epoch
        old = a.cache.epoch
        new = await servers.new_epoch()
        await b.bind_epoch()
        assert (a.cache.epoch, b.cache.epoch) == (old, new)

        key = str(uuid.uuid4())
        payment = TransactionCreate.model_validate(body())
        fingerprint = body_fingerprint(payment)
        first = asyncio.create_task(b.create(merchant, key, payment, fingerprint))
        try:
            async with asyncio.timeout(30):
                await held.out.wait()
            assert (await first).status == 202  # answered; the 0200 still out
            await asyncio.sleep(1.0)  # past the claim's grace: an abort may take it over
            aborted = await resolution.abort(a, merchant, key)
            assert aborted.status == 200 and json.loads(aborted.body)["status"] == "aborted"
            retry = await b.create(merchant, key, payment, fingerprint)
            assert retry.status == 410, (retry.status, retry.body)
        finally:
            held.release.set()
            await b.drain(30)


async def test_a_slow_epoch_re_read_never_takes_a_server_back_to_the_old_epoch(
    private_pg_backend: Backend, private_redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A background re-read read the old epoch just before new-epoch and answers late, after
    the server has bound the new one. Bound then, it took the server back: a create claimed
    under the new epoch (busy hint) finished under the old one (its hint never cleared, its
    answer cached where no read looks), and a retry on a server on the new epoch got 409
    request_in_progress for a key long completed (for as long as the hint lived)."""
    held = HeldAcquirer()
    async with _servers(private_pg_backend, private_redis.url, held, answer_within=0.5) as both:
        a, b, merchant = both.a, both.b, both.merchant
        await _create(a, merchant, str(uuid.uuid4()))  # both bound to the old epoch
        await b.refresh_epoch()  # (b's 0200s are held: its first epoch read, as a request's)
        old = b.cache.epoch
        read, late = _hold_the_next_epoch_read(monkeypatch)
        slow = asyncio.create_task(b.bind_epoch())  # the periodic re-read, slow to answer
        async with asyncio.timeout(30):
            await read.wait()
        new = await both.new_epoch()
        assert await b.bind_epoch() == new  # a later re-read (announced epoch) lands first
        await a.bind_epoch()

        key = str(uuid.uuid4())
        payment = TransactionCreate.model_validate(body())
        fingerprint = body_fingerprint(payment)
        try:
            first = await b.create(merchant, key, payment, fingerprint)
            assert first.status == 202  # claimed (busy hint under the new epoch), 0200 out
            late.set()
            assert await slow == old
        finally:
            late.set()
            held.release.set()
            await b.drain(30)
        record = await a.read(merchant, key)
        assert record is not None and record.state == KeyState.COMPLETED
        retry = await a.create(merchant, key, payment, fingerprint)
        assert retry.status == 201, (retry.status, retry.body)
        assert b.cache.epoch == new


async def test_a_re_read_announcing_the_old_epoch_after_the_marker_was_lost_is_taken_back(
    servers: Servers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server's re-read read the old epoch just before ``idempay admin new-epoch``; the new
    epoch's marker was then lost (Redis restarted from an older snapshot) and the re-read's
    announcement (SET NX) found none: it announced the OLD epoch. Before: the marker named the
    old epoch for its whole life (24 h), and every server still on it served the
    restored-away entries — a lookup answered 200 with a transaction the database no longer
    has. Now the announcer asks the database again, withdraws the stale announcement and
    announces the new epoch."""
    a, b, merchant, key = servers.a, servers.b, servers.merchant, str(uuid.uuid4())
    await _create(a, merchant, key)  # primes the lookup cache under the old epoch
    assert (await resolution.lookup(b, merchant, key)).status == 200
    old = await b.bind_epoch()
    assert old is not None and a.cache.epoch == old
    for table, column in RESTORED_AWAY:
        await asyncio.to_thread(
            servers.backend.sql, f"DELETE FROM {table} WHERE {column} = :k", k=key
        )
    read, late = _hold_the_next_epoch_read(monkeypatch)
    slow = asyncio.create_task(a.bind_epoch())  # a's periodic re-read: reads the old epoch
    try:
        async with asyncio.timeout(30):
            await read.wait()
        new = await servers.new_epoch()
        client = aioredis.Redis.from_url(servers.redis_url)
        try:
            assert await client.delete(a.cache.epoch_marker) == 1  # lost with the restart
            late.set()
            announced = await slow
            assert b.cache.epoch == old  # b has not re-read: it must not serve the old entries
            after = await resolution.lookup(b, merchant, key)
            assert after.status == 404, after.body
            assert announced == new  # the announcement of the old epoch was taken back
            assert _announced_epoch(await client.get(a.cache.epoch_marker)) == new
        finally:
            await client.aclose()
    finally:
        late.set()
    assert a.cache.epoch == new


async def test_an_announcement_the_database_cannot_confirm_is_taken_back(
    servers: Servers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The marker missing, a server announces the epoch it read; the database then does not
    answer the check that follows (it went down, or is being restored): the announcement is
    taken back, so no server is vouched for by an epoch nobody could confirm."""
    a = servers.a
    epoch = await a.bind_epoch()
    assert epoch is not None
    client = aioredis.Redis.from_url(servers.redis_url)
    try:
        assert await client.delete(a.cache.epoch_marker) == 1
        real, calls = service_module.read_epoch, []

        async def second_fails(conn: Any) -> str | None:
            calls.append(1)
            if len(calls) > 1:
                raise ConnectionResetError("the database went away")
            return await real(conn)

        monkeypatch.setattr(service_module, "read_epoch", second_fails)
        assert await a.bind_epoch() == epoch
        assert len(calls) == 2  # the read, then the check after announcing
        assert await client.get(a.cache.epoch_marker) is None
        monkeypatch.setattr(service_module, "read_epoch", real)
        assert await a.bind_epoch() == epoch  # the database back: announced again
        assert _announced_epoch(await client.get(a.cache.epoch_marker)) == epoch
    finally:
        await client.aclose()
