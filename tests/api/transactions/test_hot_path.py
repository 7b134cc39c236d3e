"""The create (claim → 0200 → finish) and the hot path's key reads
(api/transactions/inline.py) in-process, on a real database of each backend: duplicates
racing on one key, a reused key, a decline, and lookups that read the key and its
transaction without a write lock."""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest

from api.context import AppContext
from api.idempotency.keys import body_fingerprint
from api.main import build_context
from api.transactions import resolution
from api.transactions.schemas import TransactionCreate
from tests.support.backend import Backend
from tests.support.client import body, card

TABLES = {
    "idempotency_key": "key",
    "transaction": "id",
    "ledger_entry": "transaction_id",
    "outbox_event": "transaction_id",
}


@pytest.fixture
async def ctx(private_backend: Backend) -> AsyncIterator[AppContext]:
    async for context in _context(private_backend):
        yield context


@pytest.fixture
async def sqlite_ctx(private_sqlite_backend: Backend) -> AsyncIterator[AppContext]:
    """SQLite's reader thread: the embedded backend only."""
    async for context in _context(private_sqlite_backend):
        yield context


async def _context(backend: Backend) -> AsyncIterator[AppContext]:
    settings = backend.settings.model_copy(update={"db_pool_size": 4})  # shared PG
    context = await build_context(settings)
    assert context.service.inline is not None
    try:
        yield context
    finally:
        await context.service.inline.close()
        await context.engine.dispose()


async def _sql(backend: Backend, statement: str, **params: object) -> list[Any]:
    return await asyncio.to_thread(backend.sql, statement, **params)  # it runs its own loop


async def _rows(backend: Backend, key: str) -> dict[str, int]:
    counts = {}
    for table, col in TABLES.items():
        rows = await _sql(backend, f'SELECT count(*) FROM "{table}" WHERE {col} = :k', k=key)
        counts[table] = int(rows[0][0])
    return counts


def _request(**overrides: object) -> tuple[TransactionCreate, str]:
    request = TransactionCreate.model_validate(body(terminal_id="T-INLINE", **overrides))
    return request, body_fingerprint(request)


async def test_concurrent_duplicates_execute_once(
    private_backend: Backend, ctx: AppContext
) -> None:
    key = str(uuid.uuid4())
    request, fingerprint = _request()
    outcomes = await asyncio.gather(
        *(ctx.service.create("m-dup", key, request, fingerprint) for _ in range(20))
    )
    events = Counter(outcome.event for outcome in outcomes)
    assert events["created"] == 1, events
    # the others: the first one's answer replayed, or 409 while its 0200 was out
    assert events["replayed"] + events["in_progress"] == 19, events
    created = next(outcome for outcome in outcomes if outcome.event == "created")
    assert {o.body for o in outcomes if o.event == "replayed"} <= {created.body}
    assert await _rows(private_backend, key) == dict.fromkeys(TABLES, 1)


async def test_a_different_body_on_a_taken_key_is_refused_and_writes_nothing(
    private_backend: Backend, ctx: AppContext
) -> None:
    key = str(uuid.uuid4())
    first, first_fp = _request()
    other, other_fp = _request(amount=999)
    assert (await ctx.service.create("m-reuse", key, first, first_fp)).status == 201
    refused = await ctx.service.create("m-reuse", key, other, other_fp)
    assert (refused.status, refused.event) == (422, "key_reused")
    assert await _rows(private_backend, key) == dict.fromkeys(TABLES, 1)


async def test_a_declined_create_writes_no_ledger_entry(
    private_backend: Backend, ctx: AppContext
) -> None:
    key = str(uuid.uuid4())
    request, fingerprint = _request(card=card("tok_decline_do_not_honor"))
    outcome = await ctx.service.create("m-decline", key, request, fingerprint)
    assert outcome.status == 201 and b'"declined"' in outcome.body
    assert await _rows(private_backend, key) == {**dict.fromkeys(TABLES, 1), "ledger_entry": 0}


async def test_sqlite_reads_do_not_wait_for_the_write_lock(
    private_sqlite_backend: Backend, sqlite_ctx: AppContext
) -> None:
    ctx = sqlite_ctx
    """A writer holds the database lock; a lookup's key read still answers at once."""
    key = str(uuid.uuid4())
    request, fingerprint = _request()
    assert (await ctx.service.create("m-lock", key, request, fingerprint)).status == 201
    path = ctx.settings.resolved_database_url.split("///", 1)[1]
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        record = await asyncio.wait_for(ctx.service.read("m-lock", key), timeout=2)
        found = await asyncio.wait_for(resolution.lookup(ctx.service, "m-lock", key), timeout=2)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert record is not None and record.state == "completed"
    assert (found.status, found.event) == (200, "found")


async def test_lookup_renders_the_transaction_as_committed_now(ctx: AppContext) -> None:
    """The lookup's prepared read gives the create's own bytes, then the reversal's."""
    key = str(uuid.uuid4())
    request, fingerprint = _request()
    created = await ctx.service.create("m-look", key, request, fingerprint)
    found = await resolution.lookup(ctx.service, "m-look", key)
    assert (found.status, found.body) == (200, created.body)
    reversed_ = await resolution.reverse(ctx.service, "m-look", key)
    again = await resolution.lookup(ctx.service, "m-look", key)
    assert again.body == reversed_.body and b'"status":"reversed"' in again.body
    assert b'"reversed_at":null' not in again.body


async def test_a_lookup_reads_the_key_and_its_transaction_together(ctx: AppContext) -> None:
    assert ctx.service.inline is not None
    read = ctx.service.inline.read_with_transaction
    assert await read("m-join", str(uuid.uuid4())) == (None, None)
    key = str(uuid.uuid4())
    request, fingerprint = _request()
    created = await ctx.service.create("m-join", key, request, fingerprint)
    record, txn = await read("m-join", key)
    assert record == await ctx.service.inline.read("m-join", key)
    assert txn == await ctx.service.inline.read_transaction("m-join", key)
    assert txn is not None and txn.status == "approved"
    assert (await resolution.lookup(ctx.service, "m-join", key)).body == created.body
    assert await read("m-other", key) == (None, None)  # another merchant's key is not ours
