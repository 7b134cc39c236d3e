"""A create whose statement runs past ``command_timeout`` on Postgres (api/transactions/
pg_group.py, ``run`` / ``after_timeout``): it is answered only once the statement has ended
in Postgres, from what it left — never 503 ("nothing was processed") while it may still
commit, nor for a create it did commit.

In-process on a private database; the slow statement is a trigger sleeping 2 s on the
transaction insert, ``command_timeout`` 1 s. Cases: the cancel lands and the statement rolls
back (tests/api/review_gc/test_batch_written_after_503.py: 503, nothing written afterwards);
the statement commits despite the cancel (the trigger swallows it, as a commit past the point
of no return would) — each create answered from its stored row, 201; the database unreachable
when the timeout fires (a black-holed link: neither the cancel nor the check can be made,
the statement commits afterwards) — in doubt, answered 409 ``request_in_progress``, never 503.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from sqlalchemy import make_url

from api.context import AppContext
from api.db import DriverPool, utcnow
from api.idempotency.keys import body_fingerprint
from api.idempotency.store import KeyRecord
from api.main import build_context
from api.transactions import inline
from api.transactions.inline import InlineCreate, StorageUnavailableError
from api.transactions.pg_create import PgInline
from api.transactions.pg_group import GroupCommit
from api.transactions.schemas import TransactionCreate
from tests.support.backend import Backend
from tests.support.client import body

MERCHANT = "m-command-timeout"

# A stall the cancel cannot cut short: the statement goes on and commits after the timeout.
STALL_UNCANCELLABLE = """
CREATE FUNCTION stall() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  BEGIN PERFORM pg_sleep(2); EXCEPTION WHEN query_canceled THEN NULL; END;
  RETURN NULL;
END $$;
CREATE TRIGGER stall AFTER INSERT ON "transaction" FOR EACH STATEMENT EXECUTE FUNCTION stall();
"""

# A plain stall (a storage hiccup): cancellable.
STALL = """
CREATE FUNCTION stall() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_sleep(2); RETURN NULL; END $$;
CREATE TRIGGER stall AFTER INSERT ON "transaction" FOR EACH STATEMENT EXECUTE FUNCTION stall();
"""

COUNT = 'SELECT count(*) FROM "transaction" WHERE merchant_id = $1 AND id = ANY($2)'


@pytest.fixture
async def ctx(private_pg_backend: Backend) -> AsyncIterator[AppContext]:
    context = await build_context(private_pg_backend.settings)
    try:
        yield context
    finally:
        if context.service.inline is not None:
            await context.service.inline.close()
        await context.engine.dispose()


@pytest.fixture
async def admin(private_pg_backend: Backend) -> AsyncIterator[Any]:
    assert private_pg_backend.database_url is not None
    conn = await asyncpg.connect(private_pg_backend.database_url.replace("+asyncpg", ""))
    try:
        yield conn
    finally:
        await conn.close()


def _rows(ctx: AppContext, key: str | None = None) -> InlineCreate:
    request = TransactionCreate.model_validate(body(terminal_id="T-CT"))
    key = key or str(uuid.uuid4())
    return inline.build(ctx.service, MERCHANT, key, request, body_fingerprint(request), utcnow())


def _pool(url: str) -> DriverPool:
    return DriverPool(url, 2, timeout=2.0, command_timeout=1.0)


async def _whole(admin: Any, rows: InlineCreate) -> tuple[int, ...]:
    """(key rows, transactions, outbox events, issuer records) of a create."""
    row = await admin.fetchrow(
        "SELECT (SELECT count(*) FROM idempotency_key WHERE merchant_id = $1 AND key = $2),"
        ' (SELECT count(*) FROM "transaction" WHERE merchant_id = $1 AND id = $2),'
        " (SELECT count(*) FROM outbox_event WHERE merchant_id = $1 AND transaction_id = $2),"
        " (SELECT count(*) FROM issuer_authorization"
        "  WHERE merchant_id = $1 AND issuer_key = $3)",
        rows.txn.merchant_id,
        rows.txn.id,
        rows.issuer_key,
    )
    return tuple(row)


async def test_a_batch_that_committed_despite_the_timeout_is_answered_from_its_rows(
    ctx: AppContext, admin: Any
) -> None:
    """The batch statement times out, the cancel cannot stop it, it commits: every create it
    wrote is answered True (201, as written) from its stored row, none 503; a key that existed
    before the batch is answered with its row (a replay), as without the timeout."""
    existing = _rows(ctx)
    pool = _pool(ctx.settings.resolved_database_url)
    group = GroupCommit(pool, PgInline(pool, citus=False).create, writers=1)
    try:
        assert await group.create(existing) is True  # before the stall
        await admin.execute(STALL_UNCANCELLABLE)
        fresh = [_rows(ctx) for _ in range(3)]
        retry = _rows(ctx, existing.txn.id)  # another attempt of the existing key
        assert retry.response_body != existing.response_body  # built at its own time
        started = asyncio.get_running_loop().time()
        answers = await asyncio.gather(
            *(group.create(rows) for rows in (*fresh, retry)), return_exceptions=True
        )
        took = asyncio.get_running_loop().time() - started
    finally:
        await group.close()
        await pool.close()
    assert group.batches == 2 and group.fallbacks == 0  # one statement, the one timed out
    assert took >= 1.0  # it did time out (command_timeout 1 s)
    assert answers[:3] == [True, True, True], answers
    record = answers[3]
    assert isinstance(record, KeyRecord) and record.key == existing.txn.id, record
    assert record.state == "completed" and record.response_body == existing.response_body
    for rows in fresh:
        assert await _whole(admin, rows) == (1, 1, 1, 1)


async def test_a_single_create_that_committed_despite_the_timeout_is_201(
    ctx: AppContext, admin: Any
) -> None:
    """The one-statement path (guarded creates, a failed batch's creates): the same."""
    await admin.execute(STALL_UNCANCELLABLE)
    pool = _pool(ctx.settings.resolved_database_url)
    rows = _rows(ctx)
    try:
        assert await PgInline(pool, citus=False).create(rows) is True
    finally:
        await pool.close()
    assert await _whole(admin, rows) == (1, 1, 1, 1)


async def test_a_batch_cancelled_in_time_is_503_and_its_connection_is_reused(
    ctx: AppContext, admin: Any
) -> None:
    """The cancel lands: the statement is over and wrote nothing (503 is true), and the
    connection that ran it is healthy again (kept, not closed): the next batch writes."""
    await admin.execute(STALL)
    pool = _pool(ctx.settings.resolved_database_url)
    group = GroupCommit(pool, PgInline(pool, citus=False).create, writers=1)
    creates = [_rows(ctx) for _ in range(3)]
    try:
        answers = await asyncio.gather(
            *(group.create(rows) for rows in creates), return_exceptions=True
        )
        assert all(isinstance(a, StorageUnavailableError) for a in answers), answers
        await admin.execute('DROP TRIGGER stall ON "transaction"')
        later = _rows(ctx)
        assert await group.create(later) is True
        assert pool.open == 1  # the timed-out statement's connection, still in use
    finally:
        await group.close()
        await pool.close()
    assert await admin.fetchval(COUNT, MERCHANT, [r.txn.id for r in creates]) == 0
    assert await _whole(admin, later) == (1, 1, 1, 1)


class _Link:
    """A TCP link to Postgres that can go dark: ``cut()`` stops carrying bytes both ways and
    refuses new connections, without closing the open ones (a partition, not a reset)."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.dark = asyncio.Event()
        self.server: asyncio.Server | None = None
        self.port = 0
        self._writers: list[asyncio.StreamWriter] = []
        self._pipes: set[asyncio.Task[None]] = set()
        self.refuse = 0  # new connections to drop at once (asyncpg's cancel request)

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.refuse:
            self.refuse -= 1
            writer.transport.abort()
            return
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self._writers += [writer, up_writer]
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pipe(src, dst))
            self._pipes.add(task)

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        while data := await src.read(65536):
            if self.dark.is_set():
                await asyncio.Event().wait()  # lost on the way, and nothing more is carried
            dst.write(data)
            await dst.drain()

    def cut(self) -> None:
        self.dark.set()
        assert self.server is not None
        self.server.close()  # a new connection (asyncpg's cancel, the check) is refused

    async def close(self) -> None:
        for task in self._pipes:
            task.cancel()
        for writer in self._writers:
            writer.transport.abort()


async def test_a_timeout_while_the_database_is_unreachable_is_in_doubt_not_503(
    ctx: AppContext, admin: Any
) -> None:
    """The link goes dark while the batch runs: at the timeout neither the cancel nor any
    check reaches Postgres, and the statement goes on there and commits. The creates are
    answered in doubt — their keys as in flight, which the service answers 409
    ``request_in_progress`` (look up after ``Retry-After``) — never 503: the rows are there
    seconds later, as the answer allowed."""
    await admin.execute(STALL)
    url = make_url(ctx.settings.resolved_database_url)
    link = _Link(url.host or "127.0.0.1", url.port or 5432)
    await link.start()
    pool = _pool(url.set(host="127.0.0.1", port=link.port).render_as_string(False))
    group = GroupCommit(pool, PgInline(pool, citus=False).create, writers=1)
    creates = [_rows(ctx) for _ in range(3)]
    keys = [rows.txn.id for rows in creates]
    try:
        warm = _rows(ctx)  # the pool's connection opened while the link is up
        await admin.execute('ALTER TABLE "transaction" DISABLE TRIGGER stall')
        assert await group.create(warm) is True
        await admin.execute('ALTER TABLE "transaction" ENABLE TRIGGER stall')
        sent = asyncio.gather(*(group.create(rows) for rows in creates), return_exceptions=True)
        await _running(admin)
        link.cut()
        answers = await sent
        written_at_answer = await admin.fetchval(COUNT, MERCHANT, keys)
        outcomes = [  # the service's answers, at once (the in-doubt lease is the pool's 2 s)
            await ctx.service.existing(answer, rows.fingerprint)
            for rows, answer in zip(creates, answers, strict=True)
            if isinstance(answer, KeyRecord)
        ]
        await asyncio.sleep(2.5)
        written_later = await admin.fetchval(COUNT, MERCHANT, keys)
    finally:
        await group.close()
        await pool.close()
        await link.close()
    for rows, answer in zip(creates, answers, strict=True):
        assert isinstance(answer, KeyRecord), answers
        assert (answer.key, answer.state, answer.fingerprint) == (
            rows.txn.id,
            "processing",
            rows.fingerprint,
        )
    assert [(o.status, o.event) for o in outcomes] == [(409, "in_progress")] * 3, outcomes
    assert written_at_answer == 0  # not committed yet when answered...
    assert written_later == 3  # ...and committed afterwards: a 503 would have been a lie


async def _running(admin: Any) -> None:
    """Until a batch statement runs in Postgres."""
    for _ in range(100):
        if await admin.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%unnest%'"
            " AND state = 'active' AND pid <> pg_backend_pid()"
        ):
            return
        await asyncio.sleep(0.02)
    raise AssertionError("no batch statement is running")


async def test_a_cancel_that_never_arrives_is_in_doubt_even_when_the_read_finds_nothing(
    ctx: AppContext, admin: Any
) -> None:
    """The link stays up but asyncpg's cancel request is lost: the statement (3.5 s) is not
    acknowledged in time, asyncpg closes the connection, and the statement goes on in
    Postgres. The read (a new connection) finds none of the keys — yet they are answered in
    doubt, not 503: the statement had not provably ended, and it commits afterwards."""
    await admin.execute(STALL.replace("pg_sleep(2)", "pg_sleep(3.5)"))
    url = make_url(ctx.settings.resolved_database_url)
    link = _Link(url.host or "127.0.0.1", url.port or 5432)
    await link.start()
    pool = _pool(url.set(host="127.0.0.1", port=link.port).render_as_string(False))
    group = GroupCommit(pool, PgInline(pool, citus=False).create, writers=1)
    creates = [_rows(ctx) for _ in range(2)]
    keys = [rows.txn.id for rows in creates]
    try:
        sent = asyncio.gather(*(group.create(rows) for rows in creates), return_exceptions=True)
        await _running(admin)
        link.refuse = 1  # the next new connection: the cancel request
        answers = await sent
        written_at_answer = await admin.fetchval(COUNT, MERCHANT, keys)
        await asyncio.sleep(2.5)
        written_later = await admin.fetchval(COUNT, MERCHANT, keys)
    finally:
        await group.close()
        await pool.close()
        await link.close()
    assert link.refuse == 0  # the cancel was indeed refused
    assert all(isinstance(a, KeyRecord) and a.state == "processing" for a in answers), answers
    assert written_at_answer == 0
    assert written_later == 2


async def test_a_writer_that_ends_is_replaced_without_a_create(ctx: AppContext) -> None:
    """A writer cancelled outside ``close`` is replaced from its done-callback: the queue
    has its writers again before any create comes (``create`` checks nothing)."""
    pool = _pool(ctx.settings.resolved_database_url)
    group = GroupCommit(pool, PgInline(pool, citus=False).create, writers=2)
    try:
        assert await group.create(_rows(ctx)) is True
        first = list(group._tasks)
        assert len(first) == 2
        first[0].cancel()
        await asyncio.sleep(0.05)
        assert len(group._tasks) == 2 and first[0] not in group._tasks
        assert not any(task.done() for task in group._tasks)
        assert await group.create(_rows(ctx)) is True
    finally:
        await group.close()
        await pool.close()
    await asyncio.sleep(0)
    assert group._tasks == []  # ended by close: not replaced
