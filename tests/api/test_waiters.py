"""``Prefer: wait`` plumbing (issue 17): the Postgres trigger notifies a key's settlement on
commit only, the worker's LISTEN connection wakes exactly the waiters of that key, survives
its connection being killed, and the waiting table is bounded. Real Postgres."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable

import pytest

from api.events.writer import RequestOutcome
from api.idempotency.waiters import Waiters, WaitersFull, listen_args, preferred_wait
from api.transactions.outcome import IdempotencyStatus, Outcome
from api.transactions.waiting import until_settled
from tests.support.backend import Backend
from tests.support.eventually import eventually_async

INSERT_PROCESSING = (
    "INSERT INTO idempotency_key (merchant_id, key, state, lease_token, created_at, updated_at)"
    " VALUES (:m, :k, 'processing', 1, now(), now())"
)
LISTENERS = (
    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND query ILIKE 'LISTEN%'"
)


async def _merchant(backend: Backend) -> str:
    name = f"waiters-{uuid.uuid4().hex[:8]}"
    await asyncio.to_thread(backend.api_key, name)
    rows = await asyncio.to_thread(backend.sql, "SELECT id FROM merchant WHERE name = :n", n=name)
    return str(rows[0][0])


async def _listening(backend: Backend) -> Waiters:
    args = listen_args(backend.url)
    assert args is not None
    return Waiters(limit=4, listen_dsn=args)


def test_prefer_wait_is_parsed_capped_and_ignored_when_malformed() -> None:
    assert preferred_wait(None, 30) == 0
    assert preferred_wait("wait=5", 30) == 5
    assert preferred_wait("respond-async, wait=100", 30) == 30
    assert preferred_wait('return=minimal, wait="7"', 30) == 7
    assert preferred_wait("wait=abc", 30) == 0
    assert preferred_wait("handling=lenient", 30) == 0
    assert preferred_wait("nowait=5", 30) == 0
    # review: several fields are one list; ';' parameters are not preferences; quotes
    assert preferred_wait(["respond-async", "wait=2"], 30) == 2
    assert preferred_wait("handling=lenient; wait=5", 30) == 0
    assert preferred_wait('foo="bar, wait=5"', 30) == 0
    assert preferred_wait("wait=1000000", 30) == 30  # huge: capped, not ignored
    assert preferred_wait("wait=-3", 30) == 0
    assert preferred_wait("WAIT = 4", 30) == 4


def test_sqlite_has_no_listen_connection() -> None:
    assert listen_args("sqlite+aiosqlite:///var/idempay.db") is None


def _rolled_back_settle(key: str) -> str:
    return (
        "DO $$ BEGIN UPDATE idempotency_key SET state = 'completed' "
        f"WHERE key = '{key}'; RAISE EXCEPTION 'rolled back'; END $$"
    )


SETTLE = "UPDATE idempotency_key SET state = :s WHERE merchant_id = :m AND key = :k"


async def test_a_settled_key_wakes_its_waiters_on_commit_only(private_pg_backend: Backend) -> None:
    """A settlement that rolls back sends nothing; the committed one wakes that key's
    waiters and no other key's. NOTIFYs arrive in commit order, so the first notification
    the listener gets is the committed one."""
    backend = private_pg_backend
    merchant = await _merchant(backend)
    key, other = str(uuid.uuid4()), str(uuid.uuid4())
    for k in (key, other):
        await asyncio.to_thread(backend.sql, INSERT_PROCESSING, m=merchant, k=k)
    waiters = await _listening(backend)
    seen: list[str] = []
    notify = waiters.notify

    def recording(merchant_id: str, k: str) -> None:
        seen.append(k)
        notify(merchant_id, k)

    waiters.notify = recording  # type: ignore[method-assign]
    runner = asyncio.create_task(waiters.run_forever())
    try:
        await asyncio.wait_for(waiters.listening.wait(), 30)
        with waiters.watch(merchant, key) as settled, waiters.watch(merchant, other) as untouched:
            with pytest.raises(Exception, match="rolled back"):
                await asyncio.to_thread(backend.sql, _rolled_back_settle(key))
            await asyncio.to_thread(backend.sql, SETTLE, s="aborted", m=merchant, k=key)
            await asyncio.wait_for(settled.wait(), 30)
            assert not untouched.is_set()
        assert seen == [key]
        assert waiters.count == 0
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)


async def test_only_leaving_processing_notifies(private_pg_backend: Backend) -> None:
    """A lease moved (state unchanged) is not a settlement; processing → completed is."""
    backend = private_pg_backend
    merchant = await _merchant(backend)
    key = str(uuid.uuid4())
    await asyncio.to_thread(backend.sql, INSERT_PROCESSING, m=merchant, k=key)
    waiters = await _listening(backend)
    seen: list[str] = []
    notify = waiters.notify
    waiters.notify = lambda m, k: (seen.append(k), notify(m, k))[-1]  # type: ignore[method-assign,func-returns-value]
    runner = asyncio.create_task(waiters.run_forever())
    try:
        await asyncio.wait_for(waiters.listening.wait(), 30)
        with waiters.watch(merchant, key) as settled:
            await asyncio.to_thread(
                backend.sql,
                "UPDATE idempotency_key SET lease_token = 2 WHERE merchant_id = :m AND key = :k",
                m=merchant,
                k=key,
            )
            await asyncio.to_thread(backend.sql, SETTLE, s="completed", m=merchant, k=key)
            await asyncio.wait_for(settled.wait(), 30)
        await asyncio.to_thread(
            backend.sql, SETTLE, s="expired", m=merchant, k=key
        )  # not from processing
        await asyncio.to_thread(
            backend.sql, INSERT_PROCESSING, m=merchant, k=(marker := str(uuid.uuid4()))
        )
        with waiters.watch(merchant, marker) as marker_settled:
            await asyncio.to_thread(backend.sql, SETTLE, s="completed", m=merchant, k=marker)
            await asyncio.wait_for(marker_settled.wait(), 30)
        assert seen == [key, marker]
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)


async def test_a_killed_listen_connection_comes_back_and_then_wakes_everyone(
    private_pg_backend: Backend,
) -> None:
    backend = private_pg_backend
    merchant = await _merchant(backend)
    key = str(uuid.uuid4())
    await asyncio.to_thread(backend.sql, INSERT_PROCESSING, m=merchant, k=key)
    waiters = await _listening(backend)
    runner = asyncio.create_task(waiters.run_forever(retry_s=0.1))
    try:
        await asyncio.wait_for(waiters.listening.wait(), 30)
        with waiters.watch(merchant, key) as woken:
            await asyncio.to_thread(
                backend.sql, f"SELECT pg_terminate_backend(pid) FROM ({LISTENERS}) AS l"
            )
            await asyncio.wait_for(woken.wait(), 30)  # it may have missed a notification
        await eventually_async(
            lambda: asyncio.to_thread(backend.sql, LISTENERS), what="LISTEN again", timeout=30
        )
        with waiters.watch(merchant, key) as settled:
            await asyncio.to_thread(backend.sql, SETTLE, s="completed", m=merchant, k=key)
            await asyncio.wait_for(settled.wait(), 30)
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)


def test_the_waiting_table_is_bounded() -> None:
    waiters = Waiters(limit=2)
    with waiters.watch("m", "k1"), waiters.watch("m", "k1"):
        with pytest.raises(WaitersFull), waiters.watch("m", "k2"):
            pass
        assert waiters.count == 2
    assert waiters.count == 0
    with waiters.watch("m", "k2"):
        assert waiters.count == 1


async def test_a_connection_lost_inside_atomic_keeps_the_drivers_error(
    private_pg_backend: Backend,
) -> None:
    """Review: popping the settled keys off an invalidated connection raised
    PendingRollbackError over the driver's error, so a lost connection answered 500, not
    503. The driver's error must come out, and be judged storage-unavailable."""
    from api.db import atomic, create_engine
    from api.storage_errors import storage_unavailable

    engine = create_engine(private_pg_backend.settings)
    try:
        with pytest.raises(Exception) as caught:
            async with atomic(engine) as conn:
                conn.info.setdefault("idempay_settled_keys", []).append(("m", "k"))
                await conn.exec_driver_sql("SELECT pg_terminate_backend(pg_backend_pid())")
        assert storage_unavailable(caught.value), repr(caught.value)
    finally:
        await engine.dispose()


def _answer(event: RequestOutcome, status: IdempotencyStatus) -> Outcome:
    return Outcome(status=202, body=b"", event=event, idempotency_status=status)


IN_FLIGHT = _answer(RequestOutcome.PROCESSING, IdempotencyStatus.IN_PROGRESS)
SETTLED = _answer(RequestOutcome.FOUND, IdempotencyStatus.PROCESSED)


async def test_a_look_that_failed_is_made_again_without_waiting_for_another_wake() -> None:
    """Woken, the look fails (storage went away for a moment), and the key had settled
    meanwhile: the waiter looks again a second later — before, it waited for a wake that
    had already come and answered its stale in-flight look at its limit."""
    waiters = Waiters(limit=4)
    answers: list[Outcome | Exception] = [IN_FLIGHT, ConnectionError("storage"), SETTLED]

    async def look() -> Outcome:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def wake() -> None:
        await asyncio.sleep(0.1)
        waiters.notify("m", "k")

    started = asyncio.get_running_loop().time()
    waking = asyncio.ensure_future(wake())
    outcome, waited = await until_settled(waiters, "m", "k", 10.0, look)
    await waking
    assert (outcome, waited) == (SETTLED, True)
    assert asyncio.get_running_loop().time() - started < 5  # not at the 10 s limit


async def test_a_herd_looks_again_through_the_look_slots_only() -> None:
    """Woken together, a herd's looks run at most ``look_slots`` at a time (they queue for a
    slot, not for the connection pool), and every waiter still gets the settled answer."""
    waiters = Waiters(limit=100, look_slots=3)
    woken = asyncio.Event()
    running = peak = 0

    async def look() -> Outcome:
        nonlocal running, peak
        if not woken.is_set():
            return IN_FLIGHT  # the requests' own first looks: not slotted
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.02)
        running -= 1
        return SETTLED

    async def wake() -> None:
        await eventually_async(lambda: waiters.count == 30, what="30 waiting")
        woken.set()
        waiters.notify("m", "k")

    waking = asyncio.ensure_future(wake())
    results = await asyncio.gather(
        *(until_settled(waiters, "m", "k", 10.0, look) for _ in range(30))
    )
    await waking
    assert all(outcome == SETTLED and waited for outcome, waited in results)
    assert peak == 3


async def test_a_waiter_that_gets_no_look_slot_by_its_limit_answers_its_last_look() -> None:
    waiters = Waiters(limit=4, look_slots=1)
    async with waiters.look_slot(1.0) as held:  # another waiter's look holds the only slot
        assert held

        async def look() -> Outcome:
            return IN_FLIGHT

        async def wake() -> None:
            await eventually_async(lambda: waiters.count == 1, what="one waiting")
            waiters.notify("m", "k")

        waking = asyncio.ensure_future(wake())
        outcome, waited = await until_settled(waiters, "m", "k", 0.5, look)
        await waking
    assert (outcome, waited) == (IN_FLIGHT, True)


async def test_a_lookups_first_looks_queue_for_the_look_slots_and_a_failed_one_is_made_again() -> (
    None
):
    """A herd of lookups arriving at once: their first looks run at most ``look_slots`` at a
    time (before, all of them queued on the pool, and under load some waited past the pool
    timeout into a 503), and a first look that fails while storage is away is made again —
    every request gets the settled answer."""
    waiters = Waiters(limit=100, look_slots=2)
    running = peak = 0
    failed_once: set[int] = set()

    def looker(i: int) -> Callable[[], Awaitable[Outcome]]:
        async def look() -> Outcome:
            nonlocal running, peak
            running += 1
            peak = max(peak, running)
            try:
                await asyncio.sleep(0.005)
                if i % 5 == 0 and i not in failed_once:
                    failed_once.add(i)
                    raise ConnectionError("pool timeout")
                return SETTLED
            finally:
                running -= 1

        return look

    results = await asyncio.gather(
        *(until_settled(waiters, "m", "k", 10.0, looker(i), read_only=True) for i in range(40))
    )
    assert [outcome for outcome, _ in results] == [SETTLED] * 40
    assert peak == 2
    assert len(failed_once) == 8


async def test_a_creates_first_look_is_neither_slotted_nor_made_again() -> None:
    """A create's first look is the create itself: it never waits behind a herd's looks,
    and a failure is its answer (it may have committed)."""
    waiters = Waiters(limit=4, look_slots=1)
    calls = 0

    async def create() -> Outcome:
        nonlocal calls
        calls += 1
        raise ConnectionError("storage")

    async with waiters.look_slot(1.0) as held:  # a herd's look holds the only slot
        assert held
        with pytest.raises(ConnectionError):
            await asyncio.wait_for(until_settled(waiters, "m", "k", 10.0, create), 0.5)
    assert calls == 1
