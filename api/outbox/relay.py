"""``idempay relay``: publish outbox events to a Redis Stream, at least once, in order per
merchant.

One batch: number the next committed events per merchant (persisted) → XADD them in one
pipeline, in (merchant, seq) order → mark them sent. A relay killed between the XADD and
the mark publishes that batch again after restart, with the same numbers: consumers dedupe
by ``event_id`` (``consume`` below is the reference). Numbers follow the order in which
events became visible (committed) to the relay, so causally ordered events (a completion,
then its reversal) always arrive in that order, with no gaps.
On Postgres only one relay publishes at a time (a session advisory lock), so two relays
can never interleave a merchant's events; a second relay waits as a hot standby.

A stopped leader (SIGSTOP, a frozen host) keeps nothing past its lease
(``IDEMPAY_RELAY_LEASE``, api/leader_sessions.py): its lock session carries
``idle_session_timeout = lease``; each of its transactions (the tick's lock check and
numbering on the lock session, the marks, ``relay --once``'s) carries
``idle_in_transaction_session_timeout = lease`` and the relay's ``application_name``
(``idempay-relay <id>``); and every relay, leading or waiting to, ends another relay's
sessions whose transaction began more than a lease ago, which Postgres's timeouts never end
when the client stopped between a statement's parse and its execution. Else a leader
stopped between ticks would keep the lock for good, and one stopped inside a tick would
keep it, or the numbering's locks, even past ``idle_session_timeout``.

Numbering enforces leadership inside its own transaction, not only once per tick: the
leader numbers on the very session that holds the lock (and checks, in that transaction,
that it still does: a dead session cannot commit), and a relay ticking without a lock
session (``run_once()``, ``idempay relay --once``) holds the same lock for the
transaction (``pg_try_advisory_xact_lock``) or numbers nothing. Rows are claimed with
``FOR UPDATE SKIP LOCKED`` and only ``seq IS NULL`` rows are numbered, so an event is
numbered once, whatever two relays do at the same moment.

The stream is bounded: XADD trims it to about ``STREAM_MAXLEN`` entries, and it expires
``STREAM_TTL_SECONDS`` after the last publish. After each publish the relay measures it
(``idempay_outbox_stream_entries``, ``…_maxlen``, ``…_oldest_age_seconds``; served by
``idempay relay --metrics-port``) and logs ``outbox_stream_near_bound`` past 90 % of the
bound. A consumer further behind than the oldest entry has lost events from the stream;
the outbox table still has them (docs/operations.md: republish).
"""

from __future__ import annotations

import asyncio
import json
import time
import weakref
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import structlog
from sqlalchemy import bindparam, select, text, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from api import leader_sessions
from api.db import atomic, utcnow
from api.metrics import (
    OUTBOX_PUBLISHED,
    OUTBOX_STREAM_ENTRIES,
    OUTBOX_STREAM_MAXLEN,
    OUTBOX_STREAM_OLDEST_AGE,
)
from api.migrate import has_citus
from api.models import MerchantOutboxSeq, OutboxEvent
from api.outbox.writer import COMPLETED, REVERSED

log = structlog.get_logger("idempay.relay")
LOCK_ID = 0x1DE4_9A7  # pg advisory lock id for "the relay"
TAG = "idempay-relay"  # application_name of a relay's sessions in a transaction: TAG <id>
STREAM_TTL_SECONDS = 7 * 86_400
STREAM_MAXLEN = 1_000_000
NEAR_BOUND = 0.9
_COLUMNS = (
    OutboxEvent.id,
    OutboxEvent.event_id,
    OutboxEvent.merchant_id,
    OutboxEvent.seq,
    OutboxEvent.payload,
)
_HELD_BY_ME = (
    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = :lock "
    "AND granted AND pid = pg_backend_pid()"
)


class LeadershipLostError(RuntimeError):
    """The numbering transaction found its session without the leadership lock."""


class Relay:
    def __init__(
        self,
        engine: AsyncEngine,
        redis: Any,
        *,
        stream: str,
        batch: int = 500,
        mark_delay: float = 0.0,
        lease: float | None = None,
    ) -> None:
        """``lease``: ``IDEMPAY_RELAY_LEASE`` (``api.config.Settings.relay_lease``, 30 s)."""
        self.lease = lease or 30.0
        self._bound = self.lease  # how old a transaction of the relay may grow
        self._tag = leader_sessions.name(TAG)
        self.engine = leader_sessions.bounded(engine, self._tag, lambda: self._bound)
        self.redis = redis
        self.stream = stream
        self.batch = batch
        self.mark_delay = mark_delay  # fault-injection knob for tests: widen the kill window

    async def run_once(self, leader: AsyncConnection | None = None) -> int:
        """Publish one batch. ``leader``: the session holding the leadership lock (the
        numbering runs on it); without one, the batch's transaction takes the lock."""
        rows = await self._next_batch(leader)
        if not rows:
            return 0
        pipe = self.redis.pipeline(transaction=False)
        for row in rows:
            payload = json.loads(row.payload)
            payload["seq"] = row.seq
            pipe.xadd(
                self.stream,
                {"event_id": row.event_id, "payload": json.dumps(payload, separators=(",", ":"))},
                maxlen=STREAM_MAXLEN,
                approximate=True,
            )
        pipe.expire(self.stream, STREAM_TTL_SECONDS)
        pipe.xlen(self.stream)
        pipe.xrange(self.stream, "-", "+", count=1)
        *_, length, oldest = await pipe.execute()
        _measure_stream(int(length), oldest)
        if self.mark_delay:
            await asyncio.sleep(self.mark_delay)
        async with atomic(self.engine) as conn:
            await conn.execute(
                update(OutboxEvent)
                .where(OutboxEvent.id.in_([row.id for row in rows]))
                .values(sent_at=utcnow())
            )
        OUTBOX_PUBLISHED.inc(len(rows))
        return len(rows)

    async def _next_batch(self, leader: AsyncConnection | None) -> list[Any]:
        """Events numbered but not yet marked sent (a relay died mid-batch) go first, in
        their numbered order; otherwise number the next committed events, in the order
        they became visible, per merchant, and persist the numbers before publishing so a
        republished event keeps its ``seq``. Nothing, unless this transaction leads."""
        if leader is not None:
            async with leader.begin():
                await _verify_leading(leader)
                return await self._claim(leader)
        async with atomic(self.engine) as conn:
            if not await _lead_this_transaction(conn):
                return []
            return await self._claim(conn)

    async def _claim(self, conn: AsyncConnection) -> list[Any]:
        pending = (
            await conn.execute(
                select(*_COLUMNS)
                .where(OutboxEvent.sent_at.is_(None), OutboxEvent.seq.is_not(None))
                .order_by(OutboxEvent.merchant_id, OutboxEvent.seq)
                .limit(self.batch)
            )
        ).all()
        if pending:
            return list(pending)
        numbered = await _number(conn, await _fresh(conn, self.batch))
        return sorted(numbered, key=lambda row: (row.merchant_id, row.seq))

    async def run_forever(
        self, *, interval: float = 0.2, stop: Callable[[], bool] = lambda: False
    ) -> None:
        """Lead, then publish batch after batch. Leadership is a session lock: when the
        session holding it dies (a storage restart drops every connection; the lease ends
        it), the lock is gone with it, so each tick first checks that session and, if it is
        dead, the relay stops publishing, closes it and competes for the lock again. Leading
        or waiting to, it ends other relays' transactions older than the lease
        (``_end_stale``); a tick of its own is bounded by the lease."""
        lease = max(self.lease, 3 * interval)  # a lease shorter than a tick loses every lock
        self._bound = lease
        pause = interval
        while not stop():
            try:
                async with self.engine.connect() as lock_conn:
                    try:
                        await _lead(lock_conn, stop, self._tag, lease)
                        pause = interval
                        while not stop():
                            await _still_leading(lock_conn)
                            await _end_stale(lock_conn, self._tag, lease)
                            try:
                                async with asyncio.timeout(lease):
                                    published = await self.run_once(lock_conn)
                            except LeadershipLostError:
                                raise  # compete for the lock again (outer loop)
                            except Exception as exc:  # Redis or storage down: retry next tick
                                log.warning("relay_tick_failed", error=type(exc).__name__)
                                published = 0
                            if published < self.batch:
                                await asyncio.sleep(interval)
                    finally:
                        await _close_session(lock_conn)
            except Exception as exc:  # the lock's session is gone: lead again, backing off
                log.warning("relay_lead_lost", error=type(exc).__name__, retry_in=pause)
                await asyncio.sleep(pause)
                pause = min(pause * 2, 5.0)


async def number_committed(engine: AsyncEngine, *, batch: int) -> int:
    """Number the next committed events without publishing them, under the relay's rules
    (only while no relay leads, in one transaction): the webhook worker (api/webhooks/)
    orders by ``seq`` whether or not a relay runs. A relay publishes them later as it
    publishes events numbered before a crash."""
    async with atomic(engine) as conn:
        if not await _lead_this_transaction(conn):
            return 0
        return len(await _number(conn, await _fresh(conn, batch)))


_CAUSE = {REVERSED: COMPLETED}  # an event type → the type that must be numbered before it
_ROW_LOCKS: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


async def _fresh(conn: AsyncConnection, batch: int) -> list[Any]:
    """The next committed, unnumbered events in the order to number them: by id, except
    that an event comes after the events of its transaction it follows from (a reversal
    after its completion), fetched into the batch if they are not in it. Ids follow commit
    order on one Postgres, but not on Citus when rows are inserted on the workers (their
    sequences hand out per-node ranges) or once a shard moved to another node."""
    locks = await _row_locks(conn)
    query = (
        select(*_COLUMNS, OutboxEvent.type, OutboxEvent.transaction_id)
        .where(OutboxEvent.sent_at.is_(None), OutboxEvent.seq.is_(None))
        .order_by(OutboxEvent.id)
        .limit(batch)
    )
    rows = list(await conn.execute(query.with_for_update(skip_locked=True) if locks else query))
    have = {(r.merchant_id, r.transaction_id, r.type) for r in rows}
    missing = {
        (r.merchant_id, r.transaction_id, _CAUSE[r.type])
        for r in rows
        if r.type in _CAUSE and (r.merchant_id, r.transaction_id, _CAUSE[r.type]) not in have
    }
    for merchant_id, transaction_id, cause in sorted(missing):  # one merchant's shard each
        earlier = select(*_COLUMNS, OutboxEvent.type, OutboxEvent.transaction_id).where(
            OutboxEvent.merchant_id == merchant_id,
            OutboxEvent.transaction_id == transaction_id,
            OutboxEvent.type == cause,
            OutboxEvent.sent_at.is_(None),
            OutboxEvent.seq.is_(None),
        )
        rows += list(await conn.execute(earlier.with_for_update() if locks else earlier))
    first = {(r.merchant_id, r.transaction_id, r.type): r.id for r in rows}

    def position(row: Any) -> tuple[int, int]:
        cause = first.get((row.merchant_id, row.transaction_id, _CAUSE.get(row.type, "")))
        return (max(row.id, cause), 1) if cause is not None else (row.id, 0)

    return sorted(rows, key=position)


async def _row_locks(conn: AsyncConnection) -> bool:
    """Whether the batch query may lock its rows (``FOR UPDATE SKIP LOCKED``): not on Citus,
    which refuses row locks in a query over many shards. Numbering is the leader's alone
    either way (the advisory lock, on the coordinator every relay connects to), and each row
    is numbered only while its ``seq`` is NULL; the locks only keep a non-leader's stale
    read off rows the leader is numbering."""
    if conn.dialect.name != "postgresql":
        return False
    engine = conn.engine.sync_engine
    if engine not in _ROW_LOCKS:
        _ROW_LOCKS[engine] = not await conn.run_sync(has_citus)
    return _ROW_LOCKS[engine]


@dataclass(frozen=True, slots=True)
class _Numbered:
    id: int
    event_id: str
    merchant_id: str
    seq: int
    payload: str


async def _number(conn: AsyncConnection, rows: Sequence[Any]) -> list[_Numbered]:
    counts: dict[str, int] = defaultdict(int)
    for row in rows:
        counts[row.merchant_id] += 1
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    last: dict[str, int] = {}
    for merchant_id, count in sorted(counts.items()):  # one lock order: no deadlock
        upsert = (
            dialect.insert(MerchantOutboxSeq)
            .values(merchant_id=merchant_id, seq=count)
            .on_conflict_do_update(
                index_elements=[MerchantOutboxSeq.merchant_id],
                set_={"seq": MerchantOutboxSeq.seq + count},
            )
            .returning(MerchantOutboxSeq.seq)
        )
        last[merchant_id] = int((await conn.execute(upsert)).scalar_one())
    numbered: list[_Numbered] = []
    for row in rows:
        seq = last[row.merchant_id] - counts[row.merchant_id] + 1
        counts[row.merchant_id] -= 1
        numbered.append(_Numbered(row.id, row.event_id, row.merchant_id, seq, row.payload))
    if numbered:
        await conn.execute(
            update(OutboxEvent)
            .where(
                OutboxEvent.merchant_id == bindparam("row_merchant"),  # one shard per row
                OutboxEvent.id == bindparam("row_id"),
                OutboxEvent.seq.is_(None),
            )
            .values(seq=bindparam("row_seq")),
            [
                {"row_merchant": row.merchant_id, "row_id": row.id, "row_seq": row.seq}
                for row in numbered
            ],
        )
    return numbered


async def _lead(conn: AsyncConnection, stop: Callable[[], bool], tag: str, lease: float) -> None:
    """Block until this relay holds the leadership lock (Postgres; no-op on SQLite), or
    stop, ending stale transactions of other relays meanwhile (a stopped leader's lock
    session may be stuck in one). The session ends by itself once idle for ``lease``
    seconds, and is named ``tag`` all along."""
    if conn.dialect.name != "postgresql":
        return
    await leader_sessions.lock_session(conn, tag, lease)
    while not (await conn.execute(text(f"SELECT pg_try_advisory_lock({LOCK_ID})"))).scalar():
        await conn.commit()
        if stop():
            return
        await _end_stale(conn, tag, lease)
        await asyncio.sleep(1.0)
    await conn.commit()  # keep the session lock, end the transaction
    log.info("relay_leading")


async def _end_stale(conn: AsyncConnection, tag: str, lease: float) -> None:
    """End the sessions of other relays' transactions (this database, this role) that began
    more than ``lease`` seconds ago: their relay has stopped, and what they hold (the
    leadership lock, the merchants' counter rows, outbox rows) would stay held."""
    for pid, name in await leader_sessions.end_stale(conn, TAG, tag, lease):
        log.warning("relay_stale_session_ended", pid=pid, relay=name)


async def _close_session(conn: AsyncConnection) -> None:
    """Postgres: end the lock's session (and the lock with it) rather than hand a session
    that may still hold the lock, and carries ``idle_session_timeout``, back to the pool."""
    if conn.dialect.name == "postgresql":
        await conn.invalidate()


async def _verify_leading(conn: AsyncConnection) -> None:
    """Inside the numbering transaction, on the lock's own session: raise unless this
    session holds the leadership lock (Postgres); no-op on SQLite."""
    if conn.dialect.name != "postgresql":
        return
    held = await conn.execute(text(_HELD_BY_ME), {"lock": LOCK_ID})
    if not held.scalar():
        raise LeadershipLostError("this session no longer holds the relay lock")


async def _lead_this_transaction(conn: AsyncConnection) -> bool:
    """A tick without a lock session leads for its transaction only, if no relay leads."""
    if conn.dialect.name != "postgresql":
        return True
    taken = await conn.execute(text("SELECT pg_try_advisory_xact_lock(:lock)"), {"lock": LOCK_ID})
    return bool(taken.scalar())


def _measure_stream(length: int, oldest: list[Any]) -> None:
    OUTBOX_STREAM_ENTRIES.set(length)
    OUTBOX_STREAM_MAXLEN.set(STREAM_MAXLEN)
    if oldest:
        entry_id = oldest[0][0]
        text_id = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
        first_ms = int(text_id.split("-", 1)[0])  # a stream id is <ms>-<n>
        OUTBOX_STREAM_OLDEST_AGE.set(max(0.0, time.time() - first_ms / 1000))
    if length >= NEAR_BOUND * STREAM_MAXLEN:
        log.warning("outbox_stream_near_bound", entries=length, maxlen=STREAM_MAXLEN)


async def _still_leading(conn: AsyncConnection) -> None:
    """Raise unless this connection's session still holds the lock (Postgres; no-op on
    SQLite). Not just "the session is alive": after the lock's session died, the connection
    may have been silently re-established on a new session that holds no lock."""
    if conn.dialect.name == "postgresql":
        held = (await conn.execute(text(_HELD_BY_ME), {"lock": LOCK_ID})).scalar()
        await conn.commit()
        if not held:
            raise LeadershipLostError("this session no longer holds the relay lock")


def consume(
    entries: list[tuple[bytes, dict[bytes, bytes]]], seen: set[str]
) -> list[dict[str, Any]]:
    """Reference consumer step: decode stream entries, drop duplicates by event_id."""
    fresh = []
    for _entry_id, fields in entries:
        event_id = fields[b"event_id"].decode()
        if event_id in seen:
            continue
        seen.add(event_id)
        fresh.append(json.loads(fields[b"payload"]))
    return fresh
