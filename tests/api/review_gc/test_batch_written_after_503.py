"""Review gc (dea15b0): a batch answered 503 on the connection's ``command_timeout`` is still
running in Postgres, and commits later — every create of it written after its caller was told
503 ``service_unavailable`` ("storage down; nothing was processed"), and after a lookup of
the key in between answered 404 ("nothing was processed under this key").

``GroupCommit._send`` treats asyncpg's ``TimeoutError`` as storage (503 for the batch) and
``pool.discard`` terminates the connection at once. asyncpg had only scheduled the server-side
cancel (a task opening a cancel connection); ``terminate`` cancels that task before it is sent,
and Postgres does not notice a closed client while the statement runs (no
``client_connection_check_interval``): the statement finishes and its autocommit commits. The
one-statement path (``PgInline._call``) has the same hole for its one create; the batch widens
it to up to ``CAP`` (64) creates of other terminals at a time.

The slow statement here is a private database's trigger sleeping 2 s on the transaction
insert (a storage stall: fsync, I/O, a checkpoint), ``command_timeout`` 1 s — no lock wait,
so a bound on lock waits does not change it. Retrying the same key stays safe (it replays):
not a double charge, but a payment committed seconds after the server said it was not.

Passes since the fix in pg_group.run: on a timeout the connection is kept until the server
acknowledges the cancel, and only then is the create answered (here: cancelled, 503)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from api.context import AppContext
from api.db import DriverPool, utcnow
from api.idempotency.keys import body_fingerprint
from api.main import build_context
from api.transactions import inline
from api.transactions.inline import InlineCreate, StorageUnavailableError
from api.transactions.pg_create import PgInline
from api.transactions.pg_group import GroupCommit
from api.transactions.schemas import TransactionCreate
from tests.support.backend import Backend
from tests.support.client import body

MERCHANT = "m-review-gc-503"

SLOW = """
CREATE FUNCTION review_gc_stall() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_sleep(2); RETURN NULL; END $$;
CREATE TRIGGER review_gc_stall AFTER INSERT ON "transaction"
  FOR EACH STATEMENT EXECUTE FUNCTION review_gc_stall();
"""


@pytest.fixture
async def ctx(private_pg_backend: Backend) -> AsyncIterator[AppContext]:
    context = await build_context(private_pg_backend.settings)
    try:
        yield context
    finally:
        if context.service.inline is not None:
            await context.service.inline.close()
        await context.engine.dispose()


def _rows(ctx: AppContext) -> InlineCreate:
    request = TransactionCreate.model_validate(body(terminal_id="T-GC"))
    key = str(uuid.uuid4())
    return inline.build(ctx.service, MERCHANT, key, request, body_fingerprint(request), utcnow())


async def test_a_batch_answered_503_writes_nothing_afterwards(
    ctx: AppContext, private_pg_backend: Backend
) -> None:
    assert private_pg_backend.database_url is not None
    admin: Any = await asyncpg.connect(private_pg_backend.database_url.replace("+asyncpg", ""))
    await admin.execute(SLOW)
    pool = DriverPool(ctx.settings.resolved_database_url, 2, timeout=5.0, command_timeout=1.0)
    group = GroupCommit(pool, PgInline(pool, citus=False).create, writers=1)
    creates = [_rows(ctx) for _ in range(3)]
    keys = [rows.txn.id for rows in creates]
    count = 'SELECT count(*) FROM "transaction" WHERE merchant_id = $1 AND id = ANY($2)'
    try:
        answers = await asyncio.gather(
            *(group.create(rows) for rows in creates), return_exceptions=True
        )
        assert all(isinstance(a, StorageUnavailableError) for a in answers), answers
        assert await admin.fetchval(count, MERCHANT, keys) == 0  # a lookup now: 404
        await asyncio.sleep(2.5)  # nobody resends
        written = await admin.fetchval(count, MERCHANT, keys)
    finally:
        await group.close()
        await pool.close()
        await admin.close()
    assert written == 0, f"{written} of the 3 creates answered 503 were committed afterwards"


async def test_a_single_create_answered_503_writes_nothing_afterwards(
    ctx: AppContext, private_pg_backend: Backend
) -> None:
    assert private_pg_backend.database_url is not None
    admin: Any = await asyncpg.connect(private_pg_backend.database_url.replace("+asyncpg", ""))
    await admin.execute(SLOW)
    pool = DriverPool(ctx.settings.resolved_database_url, 2, timeout=5.0, command_timeout=1.0)
    rows = _rows(ctx)
    count = 'SELECT count(*) FROM "transaction" WHERE merchant_id = $1 AND id = $2'
    try:
        with pytest.raises(StorageUnavailableError):
            await PgInline(pool, citus=False).create(rows)
        assert await admin.fetchval(count, MERCHANT, rows.txn.id) == 0
        await asyncio.sleep(2.5)
        written = await admin.fetchval(count, MERCHANT, rows.txn.id)
    finally:
        await pool.close()
        await admin.close()
    assert written == 0, "the create answered 503 was committed afterwards"
