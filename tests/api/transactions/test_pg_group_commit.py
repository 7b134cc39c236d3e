"""Postgres group commit of the one-write create (api/transactions/pg_group.py), in-process on
a real database of its own: every create lands once, duplicates execute once, an existing key
writes nothing, a failing batch falls back to one statement per create, a storage failure
answers 503 to the whole batch with nothing half-written, a cancelled caller does not cancel
its batch, and shutdown drains the queue."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from api.context import AppContext
from api.db import DriverPool, utcnow
from api.idempotency.keys import body_fingerprint
from api.idempotency.store import KeyRecord
from api.main import build_context
from api.transactions import inline
from api.transactions.guard import Guard, lock_key
from api.transactions.inline import InlineCreate, StorageUnavailableError
from api.transactions.pg_create import PgInline
from api.transactions.pg_group import GroupCommit
from api.transactions.schemas import TransactionCreate
from tests.support.backend import Backend
from tests.support.client import body, card

MERCHANT = "m-group"


@pytest.fixture
async def ctx(private_pg_backend: Backend) -> AsyncIterator[AppContext]:
    settings = private_pg_backend.settings.model_copy(update={"db_pool_size": 8})
    context = await build_context(settings)
    assert isinstance(context.service.inline, PgInline)
    assert context.service.inline.group is not None  # IDEMPAY_PG_GROUP_COMMIT: on by default
    try:
        yield context
    finally:
        await context.service.inline.close()
        await context.engine.dispose()


async def _connect(backend: Backend) -> Any:
    assert backend.database_url is not None
    return await asyncpg.connect(backend.database_url.replace("+asyncpg", ""))


@pytest.fixture
async def admin(private_pg_backend: Backend) -> AsyncIterator[Any]:
    conn = await _connect(private_pg_backend)
    try:
        yield conn
    finally:
        await conn.close()


@pytest.fixture
async def holder(private_pg_backend: Backend) -> AsyncIterator[Any]:
    """The other transaction: holds a key's uncommitted row."""
    conn = await _connect(private_pg_backend)
    try:
        yield conn
    finally:
        await conn.close()


def _pool(ctx: AppContext) -> DriverPool:
    writer = ctx.service.inline
    assert isinstance(writer, PgInline)
    return writer.pool


def _group(ctx: AppContext, writers: int, lock_wait: str = "60s") -> GroupCommit:
    """A batcher of our own on the context's pool (its writer count fixed for the test). A
    batch parks on a held key for the test's whole hold (not the server's 500 ms)."""
    pool = _pool(ctx)
    group = GroupCommit(pool, PgInline(pool, citus=False).create, writers=writers)
    group.lock_wait = lock_wait
    return group


def _request(**overrides: object) -> tuple[TransactionCreate, str]:
    request = TransactionCreate.model_validate(body(terminal_id="T-GROUP", **overrides))
    return request, body_fingerprint(request)


def _rows(ctx: AppContext, key: str | None = None, **overrides: object) -> InlineCreate:
    request, fingerprint = _request(**overrides)
    return inline.build(
        ctx.service, MERCHANT, key or str(uuid.uuid4()), request, fingerprint, utcnow()
    )


async def _written(admin: Any, rows: InlineCreate) -> tuple[int, ...]:
    """(key rows, transactions, ledger entries, outbox events, issuer records) of a create."""
    row = await admin.fetchrow(
        "SELECT (SELECT count(*) FROM idempotency_key WHERE merchant_id = $1 AND key = $2),"
        ' (SELECT count(*) FROM "transaction" WHERE merchant_id = $1 AND id = $2),'
        " (SELECT count(*) FROM ledger_entry WHERE merchant_id = $1 AND transaction_id = $2),"
        " (SELECT count(*) FROM outbox_event WHERE merchant_id = $1 AND transaction_id = $2),"
        " (SELECT count(*) FROM issuer_authorization"
        "  WHERE merchant_id = $1 AND issuer_key = $3)",
        rows.txn.merchant_id,
        rows.txn.id,
        rows.issuer_key,
    )
    return tuple(row)


def _whole(rows: InlineCreate) -> tuple[int, ...]:
    return (1, 1, 1 if rows.txn.status == "approved" else 0, 1, 1)


NOTHING = (0, 0, 0, 0, 0)


async def _hold_key(admin: Any, merchant: str, key: str) -> Any:
    """Another transaction's uncommitted row of ``key``: a batch holding it parks on it."""
    holding = admin.transaction()
    await holding.start()
    await admin.execute(
        "INSERT INTO idempotency_key (merchant_id, key, state, lease_token, created_at,"
        " updated_at) VALUES ($1, $2, 'processing', 1, now(), now())",
        merchant,
        key,
    )
    return holding


async def _parked(admin: Any) -> None:
    """Until a batch statement waits on a lock. ``admin`` outside a transaction: a
    transaction sees one snapshot of ``pg_stat_activity``."""
    for _ in range(250):
        waiting = await admin.fetchval(WAITING)
        if waiting:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("no batch is waiting on the held key")


WAITING = (
    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
    " AND wait_event_type = 'Lock' AND query LIKE '%unnest%'"
)


async def test_concurrent_distinct_creates_each_land_once(ctx: AppContext, admin: Any) -> None:
    group = ctx.service.inline.group  # type: ignore[union-attr]
    assert group is not None
    keys = [str(uuid.uuid4()) for _ in range(150)]
    approved, declined = _request(), _request(card=card("tok_decline_do_not_honor"))
    requests = [declined if n % 7 == 3 else approved for n in range(len(keys))]
    outcomes = await asyncio.gather(
        *(
            ctx.service.create(MERCHANT, key, request, fingerprint)
            for key, (request, fingerprint) in zip(keys, requests, strict=True)
        )
    )
    assert {(o.status, o.event) for o in outcomes} == {(201, "created")}
    assert group.sent == len(keys) and group.batches < len(keys)  # many creates per commit
    row = await admin.fetchrow(
        """
        SELECT count(*),
          count(*) FILTER (WHERE (SELECT count(*) FROM "transaction" t
                                  WHERE t.merchant_id = k.merchant_id AND t.id = k.key) <> 1),
          count(*) FILTER (WHERE (SELECT count(*) FROM outbox_event o
                                  WHERE o.merchant_id = k.merchant_id
                                    AND o.transaction_id = k.key) <> 1),
          (SELECT count(*) FROM ledger_entry),
          (SELECT count(*) FROM "transaction" WHERE status = 'approved'),
          (SELECT count(*) FROM issuer_authorization)
        FROM idempotency_key AS k WHERE k.merchant_id = $1
        """,
        MERCHANT,
    )
    approved_count = sum(1 for r in requests if r is approved)
    assert tuple(row) == (len(keys), 0, 0, approved_count, approved_count, len(keys))


async def test_concurrent_duplicates_execute_once_and_replay_the_first(
    ctx: AppContext, admin: Any
) -> None:
    """Through the service: 20 attempts of one key among 40 other creates."""
    key = str(uuid.uuid4())
    request, fingerprint = _request()
    others = [str(uuid.uuid4()) for _ in range(40)]
    outcomes = await asyncio.gather(
        *(ctx.service.create(MERCHANT, key, request, fingerprint) for _ in range(10)),
        *(ctx.service.create(MERCHANT, other, request, fingerprint) for other in others),
        *(ctx.service.create(MERCHANT, key, request, fingerprint) for _ in range(10)),
    )
    ours = outcomes[:10] + outcomes[-10:]
    assert Counter(o.event for o in ours) == {"created": 1, "replayed": 19}
    assert {o.body for o in ours} == {ours[0].body}
    assert {o.event for o in outcomes[10:-10]} == {"created"}
    count = await admin.fetchval(
        'SELECT count(*) FROM "transaction" WHERE merchant_id = $1 AND id = $2', MERCHANT, key
    )
    assert count == 1


async def test_a_key_twice_in_one_batch_goes_to_the_next_and_gets_the_first_row(
    ctx: AppContext, admin: Any
) -> None:
    group = _group(ctx, writers=1)
    twin = _rows(ctx)
    others = [_rows(ctx) for _ in range(5)]
    try:
        results = await asyncio.gather(
            group.create(twin), *(group.create(r) for r in others), group.create(twin)
        )
    finally:
        await group.close()
    assert results[:-1] == [True] * 6
    last = results[-1]
    assert isinstance(last, KeyRecord) and last.fingerprint == twin.fingerprint
    assert last.response_body == twin.response_body
    assert (group.batches, group.sent) == (2, 7)
    assert await _written(admin, twin) == _whole(twin)


async def test_a_key_in_flight_waits_for_its_batch_while_another_batch_goes(
    ctx: AppContext, admin: Any, holder: Any
) -> None:
    """Two writers. Batch 1 (a, b) parks on another transaction's row of b; the next create
    (c) goes in batch 2 meanwhile; a second attempt of a (in flight in batch 1) is held back,
    then finds a's row after batch 1's commit."""
    group = _group(ctx, writers=2)
    a, b, c = _rows(ctx), _rows(ctx), _rows(ctx)
    holding = await _hold_key(holder, MERCHANT, b.txn.id)
    try:
        first = [asyncio.ensure_future(group.create(r)) for r in (a, b)]
        await _parked(admin)
        again = asyncio.ensure_future(group.create(a))
        assert await asyncio.wait_for(group.create(c), timeout=5) is True  # not behind b
        await asyncio.sleep(0.1)
        assert not again.done() and not any(f.done() for f in first)
    finally:
        await holding.rollback()  # b's holder gives up: batch 1 inserts b
    assert await asyncio.gather(*first) == [True, True]
    replay = await again
    assert isinstance(replay, KeyRecord) and replay.fingerprint == a.fingerprint
    await group.close()
    for rows in (a, b, c):
        assert await _written(admin, rows) == _whole(rows)


async def test_a_key_committed_by_another_transaction_while_the_batch_waited(
    ctx: AppContext, admin: Any, holder: Any
) -> None:
    """Nothing written for it, answered False (the caller reads the key); the rest lands."""
    group = _group(ctx, writers=1)
    a, b = _rows(ctx), _rows(ctx)
    holding = await _hold_key(holder, MERCHANT, b.txn.id)
    try:
        batch = asyncio.gather(group.create(a), group.create(b))
        await _parked(admin)
    finally:
        await holding.commit()
    assert await batch == [True, False]
    await group.close()
    assert await _written(admin, a) == _whole(a)
    assert await _written(admin, b) == (1, 0, 0, 0, 0)  # only the other transaction's key row


async def test_a_batch_parked_past_its_lock_wait_is_sent_again_one_by_one(
    ctx: AppContext, admin: Any, holder: Any
) -> None:
    """A key held by a stuck transaction does not hold up the creates batched with it: past
    ``lock_wait`` the batch (rolled back whole) falls back to one statement per create; the
    unrelated create is written at once, only the held key keeps waiting, and the writer goes
    on with the next batch meanwhile."""
    group = _group(ctx, writers=1, lock_wait="200ms")
    held, unrelated = _rows(ctx), _rows(ctx)
    holding = await _hold_key(holder, MERCHANT, held.txn.id)
    try:
        waiting = asyncio.ensure_future(group.create(held))
        assert await asyncio.wait_for(group.create(unrelated), timeout=5) is True
        assert (group.batches, group.fallbacks) == (1, 1)
        assert await _written(admin, unrelated) == _whole(unrelated)
        later = _rows(ctx)  # the one writer is not held by the waiting create: next batch
        assert await asyncio.wait_for(group.create(later), timeout=5) is True
        await asyncio.sleep(0.3)
        assert not waiting.done()  # its own statement waits on the holder, as it would alone
    finally:
        await holding.rollback()
    assert await waiting is True
    await group.close()
    assert await _written(admin, held) == _whole(held)


async def test_the_lock_wait_ends_with_its_statement(ctx: AppContext) -> None:
    """``lock_timeout`` is set for the batch statement's own transaction only: the connection
    goes back to the pool with the server's setting (a single create's wait is unbounded)."""
    pool = _pool(ctx)
    conn = await pool.acquire()
    try:
        default = await conn.fetchval("SHOW lock_timeout")
    finally:
        pool.release(conn)
    group = _group(ctx, writers=1, lock_wait="123ms")
    assert await group.create(_rows(ctx)) is True
    await group.close()
    conns = [await pool.acquire() for _ in range(pool.open)]  # the batch's among them
    try:
        assert {await c.fetchval("SHOW lock_timeout") for c in conns} == {default}
    finally:
        for c in conns:
            pool.release(c)


async def test_an_existing_key_in_a_batch_answers_its_row_and_writes_nothing(
    ctx: AppContext, admin: Any
) -> None:
    group = _group(ctx, writers=1)
    first = _rows(ctx)
    assert await group.create(first) is True
    again = _rows(ctx, key=first.txn.id, amount=999)  # another body: another fingerprint
    fresh = [_rows(ctx), _rows(ctx, card=card("tok_decline_do_not_honor"))]
    try:
        results = await asyncio.gather(
            group.create(fresh[0]), group.create(again), group.create(fresh[1])
        )
    finally:
        await group.close()
    assert results[0] is True and results[2] is True
    existing = results[1]
    assert isinstance(existing, KeyRecord) and existing.fingerprint == first.fingerprint
    assert await _written(admin, first) == _whole(first)
    amount = await admin.fetchval(
        'SELECT amount FROM "transaction" WHERE merchant_id = $1 AND id = $2',
        MERCHANT,
        first.txn.id,
    )
    assert amount == first.txn.amount
    for rows in fresh:
        assert await _written(admin, rows) == _whole(rows)
    # Through the service: the other body on the taken key is 422, nothing written.
    request, fingerprint = _request(amount=999)
    refused = await ctx.service.create(MERCHANT, first.txn.id, request, fingerprint)
    assert (refused.status, refused.event) == (422, "key_reused")


async def test_a_batch_statement_error_falls_back_to_one_statement_per_create(
    ctx: AppContext, admin: Any
) -> None:
    """An issuer record left for a new key (a purged tombstone's void leaves one) fails the
    batch's statement: rolled back whole, each create sent again alone — only that one is
    refused (False: the general path answers it), the others land once."""
    group = _group(ctx, writers=1)
    stray = _rows(ctx)
    await admin.execute(
        "INSERT INTO issuer_authorization (merchant_id, issuer_key, result, amount,"
        " currency, calls, created_at) VALUES ($1, $2, 'approved', 1, 'BRL', 1, now())",
        MERCHANT,
        stray.issuer_key,
    )
    others = [_rows(ctx) for _ in range(3)]
    try:
        results = await asyncio.gather(
            *(group.create(r) for r in others[:2]), group.create(stray), group.create(others[2])
        )
    finally:
        await group.close()
    assert results == [True, True, False, True]
    assert (group.batches, group.fallbacks) == (1, 1)
    assert await _written(admin, stray) == (0, 0, 0, 0, 1)  # only the stray issuer record
    for rows in others:
        assert await _written(admin, rows) == _whole(rows)


async def test_a_storage_failure_is_503_for_the_whole_batch_and_writes_nothing(
    ctx: AppContext, admin: Any, holder: Any, private_pg_backend: Backend
) -> None:
    """The batch's connection is terminated mid-statement (the commit's outcome unknown to
    the writer): every create of the batch raises StorageUnavailableError, none of them is
    written; the next batch writes on a fresh connection."""
    group = _group(ctx, writers=1)
    batch = [_rows(ctx) for _ in range(4)]
    holding = await _hold_key(holder, MERCHANT, batch[2].txn.id)
    try:
        sent = asyncio.gather(*(group.create(r) for r in batch), return_exceptions=True)
        await _parked(admin)
        killed = await admin.fetchval(
            WAITING.replace("count(*)", "count(pg_terminate_backend(pid))")
        )
        assert killed == 1
        results = await sent
    finally:
        await holding.rollback()
    assert all(isinstance(r, StorageUnavailableError) for r in results), results
    for rows in batch:
        assert await _written(admin, rows) == NOTHING
    later = _rows(ctx)
    assert await group.create(later) is True
    await group.close()
    assert await _written(admin, later) == _whole(later)


async def test_no_connection_is_503_for_the_batch(ctx: AppContext, admin: Any) -> None:
    url = ctx.settings.resolved_database_url
    closed = DriverPool(url, 2, timeout=1)
    await closed.close()
    group = GroupCommit(closed, PgInline(closed, citus=False).create, writers=2)
    batch = [_rows(ctx) for _ in range(3)]
    results = await asyncio.gather(*(group.create(r) for r in batch), return_exceptions=True)
    await group.close()
    assert all(isinstance(r, StorageUnavailableError) for r in results), results
    for rows in batch:
        assert await _written(admin, rows) == NOTHING


async def test_a_cancelled_caller_does_not_cancel_its_batch(
    ctx: AppContext, admin: Any, holder: Any
) -> None:
    """A caller cancelled while its batch is in flight: the batch commits, the others are
    answered; a caller cancelled while its create is still queued: that create is not sent."""
    group = _group(ctx, writers=1)
    a, b, c, queued = _rows(ctx), _rows(ctx), _rows(ctx), _rows(ctx)
    holding = await _hold_key(holder, MERCHANT, b.txn.id)
    try:
        tasks = [asyncio.ensure_future(group.create(r)) for r in (a, b, c)]
        await _parked(admin)
        late = asyncio.ensure_future(group.create(queued))  # queued behind the parked batch
        await asyncio.sleep(0.05)
        tasks[0].cancel()
        late.cancel()
        await asyncio.sleep(0.05)
    finally:
        await holding.rollback()
    assert await asyncio.gather(tasks[1], tasks[2]) == [True, True]
    assert tasks[0].cancelled() and late.cancelled()
    await group.close()
    assert await _written(admin, a) == _whole(a)  # its batch went on without its caller
    assert await _written(admin, queued) == NOTHING  # never sent
    assert group.sent == 3


async def test_a_writer_cancelled_mid_batch_is_503_for_its_batch_and_replaced(
    ctx: AppContext, admin: Any, holder: Any
) -> None:
    """Only shutdown cancels a writer; should one end anyway, its batch's outcome is unknown
    (503: a retry is safe) and the next create gets a new writer instead of waiting forever."""
    group = _group(ctx, writers=1)
    a, b = _rows(ctx), _rows(ctx)
    holding = await _hold_key(holder, MERCHANT, b.txn.id)
    try:
        sent = asyncio.gather(group.create(a), group.create(b), return_exceptions=True)
        await _parked(admin)
        for task in group._tasks:
            task.cancel()
        results = await sent
    finally:
        await holding.rollback()
    assert all(isinstance(r, StorageUnavailableError) for r in results), results
    later = _rows(ctx)
    assert await asyncio.wait_for(group.create(later), timeout=5) is True
    await group.close()
    assert await _written(admin, later) == _whole(later)


async def test_close_drains_the_queue_before_the_pool_closes(
    ctx: AppContext, admin: Any, holder: Any, private_pg_backend: Backend
) -> None:
    """``PgInline.close`` (the lifespan's, after the last request): the batch in flight and
    everything queued behind it are written and answered, then the pool closes."""
    pool = DriverPool(ctx.settings.resolved_database_url, 2, timeout=5)
    writer = PgInline(pool, citus=False, group_commit=True)
    assert writer.group is not None
    writer.group.lock_wait = "60s"
    rows = [_rows(ctx) for _ in range(6)]
    holding = await _hold_key(holder, MERCHANT, rows[1].txn.id)
    try:
        first = [asyncio.ensure_future(writer.create(r)) for r in rows[:2]]
        await _parked(admin)
        queued = [asyncio.ensure_future(writer.create(r)) for r in rows[2:]]
        await asyncio.sleep(0)
        closing = asyncio.ensure_future(writer.close())
        await asyncio.sleep(0.2)
        assert not closing.done()
    finally:
        await holding.rollback()
    await asyncio.wait_for(closing, timeout=10)
    assert await asyncio.gather(*first, *queued) == [True] * 6
    for r in rows:
        assert await _written(admin, r) == _whole(r)
    with pytest.raises(StorageUnavailableError):  # after close: the pool is closed
        await writer.create(_rows(ctx))


async def test_guarded_creates_keep_one_statement(ctx: AppContext, admin: Any) -> None:
    writer = ctx.service.inline
    assert isinstance(writer, PgInline) and writer.group is not None
    before = writer.group.sent
    rows = _rows(ctx)
    txn = rows.txn
    guard = Guard(
        window_s=120,
        allow=False,
        card_fingerprint=txn.card_fingerprint,
        lock=lock_key(txn.merchant_id, txn.terminal_id, txn.card_fingerprint, txn.amount,
                      txn.currency),
    )  # fmt: skip
    assert await writer.create(rows, guard) is True
    assert writer.group.sent == before
    assert await _written(admin, rows) == _whole(rows)


def test_the_setting_turns_group_commit_off() -> None:
    pool = DriverPool("postgresql+asyncpg://u@127.0.0.1/none", 2, timeout=1)
    assert PgInline(pool, citus=False).group is None
    assert PgInline(pool, citus=True, group_commit=True).group is None  # Citus: one statement
    assert PgInline(pool, citus=False, group_commit=True).group is not None
