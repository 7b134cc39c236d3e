"""Review gc (dea15b0), the head of line's other face: a create that shares a batch with a
key parked on another transaction's lock is parked with it, and when the statement hits the
connection's ``command_timeout`` (30 s by default; 1 s here) the whole batch is answered
``StorageUnavailableError`` (503 ``service_unavailable``, "storage down") — the unrelated
create too, though storage was up and its own key was never contended. Each one-write create
on its own statement (before dea15b0) writes the unrelated create at once.

Not payment-visible (a 503 stores nothing and the retry writes it), but one locked key turns
into 503s for up to 63 other payments of its batch, and every one of them waits the full
timeout first. In-process, on a private Postgres database, with the server's own batcher.

Failed on dea15b0; passes since 7a5e65f (kept to guard the fix). Since session 7 the parked
key itself is answered in flight (409, ``pg_group.held_elsewhere``) once its own statement
has waited ``LOCK_WAIT`` alone, instead of 503 at ``command_timeout``.
"""

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
from api.idempotency.store import PROCESSING, KeyRecord
from api.main import build_context
from api.transactions import inline
from api.transactions.inline import InlineCreate
from api.transactions.pg_create import PgInline
from api.transactions.pg_group import GroupCommit
from api.transactions.schemas import TransactionCreate
from tests.support.backend import Backend
from tests.support.client import body

MERCHANT = "m-review-gc"


@pytest.fixture
async def ctx(private_pg_backend: Backend) -> AsyncIterator[AppContext]:
    context = await build_context(private_pg_backend.settings)
    try:
        yield context
    finally:
        if context.service.inline is not None:
            await context.service.inline.close()
        await context.engine.dispose()


def _rows(ctx: AppContext, key: str) -> InlineCreate:
    request = TransactionCreate.model_validate(body(terminal_id="T-GC"))
    return inline.build(ctx.service, MERCHANT, key, request, body_fingerprint(request), utcnow())


async def test_an_unrelated_create_in_a_parked_batch_is_written(
    ctx: AppContext, private_pg_backend: Backend
) -> None:
    assert private_pg_backend.database_url is not None
    pool = DriverPool(ctx.settings.resolved_database_url, 2, timeout=5.0, command_timeout=1.0)
    group = GroupCommit(pool, PgInline(pool, citus=False).create, writers=1)
    holder: Any = await asyncpg.connect(private_pg_backend.database_url.replace("+asyncpg", ""))
    locked, unrelated = str(uuid.uuid4()), str(uuid.uuid4())
    tx = holder.transaction()
    await tx.start()
    try:
        await holder.execute(
            "INSERT INTO idempotency_key (merchant_id, key, state, lease_token, created_at,"
            " updated_at) VALUES ($1, $2, 'processing', 1, now(), now())",
            MERCHANT,
            locked,
        )
        # both queued before the writer runs: one batch
        answers = await asyncio.gather(
            group.create(_rows(ctx, locked)),
            group.create(_rows(ctx, unrelated)),
            return_exceptions=True,
        )
    finally:
        await tx.rollback()
        await holder.close()
        await group.close()
        await pool.close()
    # the parked key: alone, past its own lock wait, answered in flight (409, nothing written)
    assert isinstance(answers[0], KeyRecord), answers[0]
    assert answers[0].state == PROCESSING and answers[0].lease_token == 0
    assert answers[1] is True, answers[1]  # the unrelated create: written, as alone
