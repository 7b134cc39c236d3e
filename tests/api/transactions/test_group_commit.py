"""Group commit of the create's writes (api/transactions/group_commit.py), on both backends:
many claims per commit and many finishes per commit, each create still answered from its
own write; a key held by another transaction fails alone and its batch-mates are written
again; a batch whose transaction fails answers every waiter with that failure."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from api.storage_errors import StorageUnavailableError
from api.transactions import group_commit
from api.transactions import service as service_module
from api.transactions.group_commit import GroupCommit
from api.transactions.service import CLAIM_LOCK_TIMEOUT, TransactionService
from tests.support.backend import Backend
from tests.support.stalls import dsn, held_key
from tests.support.transaction_service import (
    ApprovingAcquirer,
    lose_claim_acknowledgements,
    new_payment,
    private_engine,
    running_service,
    transaction_service,
)

MERCHANT = "mer_group_commit"
CREATES = 40


def counting_acquirer() -> ApprovingAcquirer:
    """Approves each 0200 after a short pause (a network round trip), and counts them."""
    return ApprovingAcquirer(pause=0.005)


@pytest.fixture
async def service(private_backend: Backend) -> AsyncIterator[TransactionService]:
    async with running_service(private_backend, counting_acquirer(), db_pool_size=8) as service:
        yield service


@pytest.fixture
async def engine(private_backend: Backend) -> AsyncIterator[AsyncEngine]:
    async with private_engine(private_backend) as engine:
        yield engine


async def _counts(service: TransactionService, keys: list[str]) -> dict[str, tuple[int, int]]:
    """Per key: (its transactions, its charge ledger entries)."""
    async with service.engine.connect() as conn:
        rows = (
            await conn.execute(
                text(
                    'SELECT t.id, count(DISTINCT t.id), count(l.entry_id) FROM "transaction" t'
                    " LEFT JOIN ledger_entry l ON l.transaction_id = t.id AND l.kind = 'charge'"
                    " WHERE t.merchant_id = :m GROUP BY t.id"
                ),
                {"m": MERCHANT},
            )
        ).all()
    return {row[0]: (row[1], row[2]) for row in rows if row[0] in keys}


async def test_concurrent_creates_share_commits_and_each_is_written_once(
    service: TransactionService,
) -> None:
    payments = [new_payment(100 + n) for n in range(CREATES)]
    outcomes = await asyncio.gather(
        *(service.create(MERCHANT, key, payment, fp) for key, payment, fp in payments)
    )
    assert [outcome.status for outcome in outcomes] == [201] * CREATES
    for (key, payment, _fp), outcome in zip(payments, outcomes, strict=True):
        assert f'"id":"{key}"'.encode() in outcome.body.replace(b" ", b"")
        assert f'"amount":{payment.amount}'.encode() in outcome.body.replace(b" ", b"")
    assert service.claims.writes == CREATES and service.finishes.writes == CREATES
    # Many claims per commit and many finishes per commit: fewer transactions than creates.
    assert service.claims.batches < CREATES, service.claims.batches
    assert service.finishes.batches < CREATES, service.finishes.batches
    keys = [key for key, _p, _f in payments]
    assert await _counts(service, keys) == {key: (1, 1) for key in keys}
    assert len(service.acquirer.rrns) == CREATES  # type: ignore[attr-defined]
    # Replays answer from each key's own stored response.
    again = await asyncio.gather(
        *(service.create(MERCHANT, key, payment, fp) for key, payment, fp in payments)
    )
    assert [outcome.body for outcome in again] == [outcome.body for outcome in outcomes]
    assert len(service.acquirer.rrns) == CREATES  # type: ignore[attr-defined]


async def test_a_held_key_fails_alone_and_its_batch_mates_are_written(
    private_pg_backend: Backend,
) -> None:
    backend = private_pg_backend
    service = transaction_service(backend, counting_acquirer())
    engine = service.engine
    # One lane that never widens, held by a gate until every create below has queued: they
    # are then written as one batch, the held key among them.
    service.claims = GroupCommit(
        engine, kind="claim", lanes=1, max_lanes=1, prologue=CLAIM_LOCK_TIMEOUT, new_key=True
    )
    gate = asyncio.Event()

    async def hold_the_lane(conn: AsyncConnection) -> bool:
        await gate.wait()
        return False

    key, payment, fp = new_payment(999)
    try:
        # another create's claim, not committed
        async with held_key(dsn(backend), MERCHANT, key) as held:
            others = [new_payment(200 + n) for n in range(12)]
            lane = asyncio.ensure_future(service.claims.run(hold_the_lane))
            creates = asyncio.gather(
                service.create(MERCHANT, key, payment, fp),
                *(service.create(MERCHANT, k, p, f) for k, p, f in others),
            )
            for _ in range(3000):
                if len(service.claims._pending) == 1 + len(others):
                    break
                await asyncio.sleep(0.01)
            else:
                raise AssertionError("the creates did not queue behind the held lane")
            gate.set()
            outcomes = await creates
            assert await lane is False
            assert outcomes[0].status == 409 and b"request_in_progress" in outcomes[0].body
            assert [outcome.status for outcome in outcomes[1:]] == [201] * len(others)
            await held.release()
            keys = [k for k, _p, _f in others]
            assert await _counts(service, keys) == {k: (1, 1) for k in keys}
            # the gate's batch; the batch of 13, rolled back at the held key; the 12 again
            assert service.claims.batches == 3, service.claims.batches
            assert service.claims.writes == 1 + len(others)
    finally:
        await engine.dispose()


async def test_a_failed_batch_answers_every_waiter_with_its_error(
    engine: AsyncEngine,
) -> None:
    committer: GroupCommit[int] = GroupCommit(engine, kind="claim", lanes=1)
    try:
        gate = asyncio.Event()

        async def slow(conn: AsyncConnection) -> int:
            await gate.wait()  # holds the lane while the others queue
            return 0

        def write(n: int) -> object:
            async def work(conn: AsyncConnection) -> int:
                await conn.execute(text("SELECT 1"))
                if n == 3:  # a statement error of its own (not an outage)
                    await conn.execute(
                        text("INSERT INTO idempotency_key (merchant_id, key) VALUES (NULL, NULL)")
                    )
                return n

            return work

        first = asyncio.ensure_future(committer.run(slow))
        await asyncio.sleep(0.05)
        queued = [asyncio.ensure_future(committer.run(write(n))) for n in range(6)]  # type: ignore[arg-type]
        gate.set()
        assert await first == 0
        results = await asyncio.gather(*queued, return_exceptions=True)
        # The failing work is answered with its own error; the others went again, together.
        assert [r for r in results if isinstance(r, Exception)] == [results[3]]
        assert "null" in str(results[3]).lower()
        assert [r for r in results if not isinstance(r, Exception)] == [0, 1, 2, 4, 5]
        assert committer.batches == 3 and committer.writes == 6
    finally:
        await committer.close()


async def test_a_batch_whose_transaction_fails_answers_every_waiter_with_that_failure(
    engine: AsyncEngine,
) -> None:
    # The batch's own first statement fails: nothing of any work is written.
    committer: GroupCommit[int] = GroupCommit(
        engine, kind="claim", lanes=1, prologue="SELECT idempay_no_such_column FROM idempotency_key"
    )
    ran: list[int] = []
    try:

        def write(n: int) -> object:
            async def work(conn: AsyncConnection) -> int:
                ran.append(n)
                return n

            return work

        results = await asyncio.gather(
            *(committer.run(write(n)) for n in range(5)),  # type: ignore[arg-type]
            return_exceptions=True,
        )
        assert all(isinstance(r, Exception) for r in results), results
        assert all("idempay_no_such_column" in str(r) for r in results)
        assert ran == [] and committer.writes == 0
    finally:
        await committer.close()


async def test_a_write_queued_past_the_timeout_is_never_written_and_says_so(
    engine: AsyncEngine,
) -> None:
    committer: GroupCommit[int] = GroupCommit(
        engine, kind="claim", lanes=1, max_lanes=1, queue_timeout=0.3
    )
    gate = asyncio.Event()
    ran: list[str] = []
    try:

        async def stalled(conn: AsyncConnection) -> int:
            ran.append("stalled")
            await gate.wait()  # every lane taken (a commit waiting on a standby that is gone)
            return 0

        async def queued(conn: AsyncConnection) -> int:
            ran.append("queued")
            return 1

        lane = asyncio.ensure_future(committer.run(stalled))
        await asyncio.sleep(0.05)
        with pytest.raises(StorageUnavailableError, match="nothing was written"):
            await committer.run(queued)
        gate.set()
        assert await lane == 0  # the stalled batch started before the bound: it is waited for
        await asyncio.sleep(0.05)
        assert ran == ["stalled"] and committer.writes == 1  # the queued work never ran
    finally:
        await committer.close()


async def test_same_key_claims_whose_commit_acknowledgement_is_lost_send_one_0200(
    private_pg_backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Five creates of one key and body in one batch of claims, the batch committed and its
    acknowledgement lost (the connection dropped after the COMMIT reached the WAL): each
    reads the key back, and only the create whose claim the row is — by fingerprint and
    claim time — drives it. Every create here runs in the same microsecond (the clock
    frozen), so claim times must be unique per process, or all five take the row for
    theirs and send five 0200s."""
    acquirer = counting_acquirer()
    service = transaction_service(private_pg_backend, acquirer)
    frozen = service_module.utcnow()
    monkeypatch.setattr(service_module, "utcnow", lambda: frozen)
    lose_claim_acknowledgements(service)
    try:
        key, payment, fp = new_payment(555)
        outcomes = await asyncio.gather(
            *(service.create(MERCHANT, key, payment, fp) for _ in range(5))
        )
        assert len(acquirer.rrns) == 1, acquirer.rrns
        # the others answer from the key: in flight, or — read back after the owner's finish
        # (a loaded machine) — the stored response, byte for byte
        answered = [outcome.body for outcome in outcomes if outcome.status == 201]
        assert answered and len(set(answered)) == 1, outcomes
        assert {outcome.status for outcome in outcomes} <= {201, 202, 409}, outcomes
        assert await _counts(service, [key]) == {key: (1, 1)}
    finally:
        await service.drain(5)
        await service.engine.dispose()


async def test_claim_times_are_unique_yet_follow_a_clock_stepped_back(
    service: TransactionService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Claims of one microsecond get distinct times; a wall clock stepped back an hour (an
    NTP correction) is followed at once — a claim time held an hour ahead would stretch
    every lease by that hour."""
    now = service_module.utcnow()
    monkeypatch.setattr(service_module, "utcnow", lambda: now)
    first, second, third = (service._claim_time() for _ in range(3))
    assert first < second < third and third - first < timedelta(milliseconds=1)
    back = now - timedelta(hours=1)
    monkeypatch.setattr(service_module, "utcnow", lambda: back)
    assert service._claim_time() == back


async def test_a_batch_holds_one_partition_only(engine: AsyncEngine) -> None:
    """On Citus the partition is the merchant: a batch is one shard's transaction. Works of
    two partitions queued together go in two batches, each in its queue order."""
    committer: GroupCommit[str] = GroupCommit(engine, kind="claim", lanes=1, max_lanes=1)
    gate = asyncio.Event()
    batches: list[list[str]] = []
    try:

        async def hold(conn: AsyncConnection) -> str:
            await gate.wait()
            return "gate"

        def write(name: str) -> object:
            async def work(conn: AsyncConnection) -> str:
                if not batches or batches[-1][-1] == "end":
                    batches.append([])
                batches[-1].append(name)
                return name

            return work

        lane = asyncio.ensure_future(committer.run(hold))
        await asyncio.sleep(0.05)
        names = ["a1", "b1", "a2", "b2", "a3"]
        queued = [
            asyncio.ensure_future(committer.run(write(n), partition=n[0]))  # type: ignore[arg-type]
            for n in names
        ]
        await asyncio.sleep(0.05)
        gate.set()
        assert await lane == "gate"
        assert await asyncio.gather(*queued) == names
        assert committer.batches == 3  # the gate's; a1 a2 a3; b1 b2
        assert committer.writes == 6
    finally:
        await committer.close()


async def test_a_batch_in_flight_holds_no_other_partition_back(
    pg_backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lanes are counted per partition (on Citus: per merchant): while one merchant's batch
    is in flight, another merchant's write gets a batch of its own at once; a second write of
    the busy merchant waits for its lane. (No batch counts as stalled here: the stall rule
    would free a lane after ``STALL_S`` whatever the partitions. Postgres: the partitions
    are Citus's; SQLite writes one transaction at a time.)"""
    monkeypatch.setattr(group_commit, "STALL_S", 3600.0)
    async with private_engine(pg_backend) as engine:
        await _two_partitions(engine)


async def _two_partitions(engine: AsyncEngine) -> None:
    committer: GroupCommit[str] = GroupCommit(engine, kind="claim", lanes=1, max_lanes=4)
    gate = asyncio.Event()
    try:

        async def hold(conn: AsyncConnection) -> str:
            await gate.wait()
            return "held"

        async def write(conn: AsyncConnection) -> str:
            return "written"

        held = asyncio.ensure_future(committer.run(hold, partition="a"))
        await asyncio.sleep(0.01)
        other = asyncio.ensure_future(committer.run(write, partition="b"))
        same = asyncio.ensure_future(committer.run(write, partition="a"))
        assert await asyncio.wait_for(other, 30) == "written"  # a's batch still held
        await asyncio.sleep(0.2)
        assert not same.done() and not held.done()
        gate.set()
        assert await held == "held" and await same == "written"
        assert committer.batches == 3
    finally:
        gate.set()
        await committer.close()
