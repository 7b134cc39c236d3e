"""``Prefer: wait=N`` on create, lookup and abort (contract §2.8, issue 17).

A request that finds its key in flight — a duplicate create answered 409
``request_in_progress``, a lookup answered 202 ``processing``, an abort answered 409 — and
asked ``Prefer: wait=N`` is held until the key settles or ``N`` seconds pass (``N`` capped
at ``IDEMPAY_PREFER_WAIT_MAX``), then answered as usual: the replay, the transaction, the
fence — or, at the time limit, its last in-flight answer with ``Retry-After``.
``Preference-Applied: wait=N`` says it waited.

Only in-flight answers wait. The create that claimed the key itself and whose issuer call
timed out still answers 202 at once (its request event stays ``created``: the audit counts
that key once); its duplicates and lookups wait.

The waiter registers before its first look, so a settlement between the look and the wait
is never missed. It looks again when woken (the key settled or was handed over), when the
in-flight answer says it may change by then without a settlement (``Outcome.recheck_s``: a
lease running out, an abort's grace), and — on SQLite only — every ``Waiters.recheck_s``
(a settlement by another process). It stops waiting when the client disconnects, when the
worker shuts down (the last look is the answer), or at its limit. A look that fails while
storage is down is retried, at most once a second, until the limit; at the limit the last
in-flight answer stands. When this worker's waiting table is full the request is answered
at once, as without the preference. Woken waiters look again through a bounded number of
look slots (``Waiters.look_slots``: half the worker's hot-path connections), so a herd of
hundreds on one key queues for slots instead of for the pool, whose timeout would answer
503 (waiting is 503-free). A lookup's first look (``read_only``: it changes nothing, so it
may be made again) goes through a look slot too and is retried like the later ones: a herd
arriving at once on a small pool queued its first looks on the pool, and under load some
waited past ``IDEMPAY_DB_TIMEOUT`` into a 503. A create's or abort's first look is the
request itself: neither slotted (a create never waits behind a herd's lookups) nor made
again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from api.events.writer import RequestOutcome
from api.idempotency.waiters import Waiters, WaitersFull
from api.storage_errors import StorageUnavailableError
from api.transactions.outcome import IdempotencyStatus, Outcome

IN_FLIGHT_EVENTS = frozenset({RequestOutcome.IN_PROGRESS, RequestOutcome.PROCESSING})
STORAGE_RETRY_S = 1.0


def in_flight(outcome: Outcome) -> bool:
    return (
        outcome.idempotency_status == IdempotencyStatus.IN_PROGRESS
        and outcome.event in IN_FLIGHT_EVENTS
    )


async def until_settled(
    waiters: Waiters,
    merchant_id: str,
    key: str,
    seconds: float,
    look: Callable[[], Awaitable[Outcome]],
    *,
    gone: asyncio.Event | None = None,
    read_only: bool = False,
) -> tuple[Outcome, bool]:
    """The answer of ``look`` once the key has settled (or the last in-flight one at the
    limit); and whether the request waited. ``gone``: set when the client disconnected.
    ``read_only``: ``look`` changes nothing (a lookup), so its first call is slotted and
    retried like the later ones."""
    if seconds <= 0:
        return await look(), False
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    with contextlib.ExitStack() as stack:
        try:
            settled = stack.enter_context(waiters.watch(merchant_id, key))
        except WaitersFull:
            return await look(), False
        # registered first: a settlement from now on is not missed
        outcome = await (_first_read(waiters, look, deadline) if read_only else look())
        if not in_flight(outcome):
            return outcome, False
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0 or _stop(waiters, gone):
                return outcome, True
            await _first(settled, gone, min([remaining, *_hints(outcome, waiters)]))
            if _stop(waiters, gone) or loop.time() >= deadline:
                return outcome, True
            settled.clear()
            try:
                async with waiters.look_slot(deadline - loop.time()) as free:
                    if not free:  # every look slot busy until the limit: the last answer
                        return outcome, True
                    again = await look()
            except Exception:
                if deadline - loop.time() <= STORAGE_RETRY_S:
                    raise  # storage down at the limit: the usual 503
                await asyncio.sleep(STORAGE_RETRY_S)
                settled.set()  # look again now: the settlement may have come meanwhile
                continue
            if not in_flight(again):
                return again, True
            outcome = again


async def _first_read(
    waiters: Waiters, look: Callable[[], Awaitable[Outcome]], deadline: float
) -> Outcome:
    """A lookup's first look through a look slot, made again at most once a second while
    storage is away, until the limit (then the usual 503). No slot by the limit: the look is
    made anyway — there is no earlier answer to give."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            async with waiters.look_slot(deadline - loop.time()) as free:
                if free:
                    return await look()
            return await look()
        except Exception:
            if deadline - loop.time() <= STORAGE_RETRY_S:
                raise
            await asyncio.sleep(STORAGE_RETRY_S)


def _stop(waiters: Waiters, gone: asyncio.Event | None) -> bool:
    return waiters.closing or (gone is not None and gone.is_set())


def _hints(outcome: Outcome, waiters: Waiters) -> list[float]:
    hints = []
    if outcome.recheck_s is not None:
        hints.append(max(outcome.recheck_s, 0.05))
    if waiters.recheck_s is not None:
        hints.append(waiters.recheck_s)
    return hints


async def _first(settled: asyncio.Event, gone: asyncio.Event | None, within: float) -> None:
    """Until the key may have settled, the client went away, or ``within`` s passed."""
    waits = [asyncio.ensure_future(settled.wait())]
    if gone is not None:
        waits.append(asyncio.ensure_future(gone.wait()))
    try:
        await asyncio.wait(waits, timeout=within, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in waits:
            task.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.gather(*waits, return_exceptions=True)


async def before_exit(
    waiters: Waiters,
    work: Callable[[], Awaitable[Outcome]],
    in_flight: Callable[[], Outcome],
) -> Outcome:
    """``work``'s answer, unless the worker's exit comes first (``Waiters.exit_passed``: set
    ``api.main.EXIT_ANSWER_MARGIN_S`` before uvicorn's graceful shutdown ends and answers
    every request still in flight a bare text/plain 500). Then the create is answered in
    flight (``in_flight``: 409 ``request_in_progress``, ``Retry-After``) — its statement or
    issuer call may still end in a commit, which the terminal's lookup shows — and ``work``
    goes on on its own until the worker stops. A create that begins after that moment is
    not started: 503, nothing processed (the terminal retries the same key elsewhere)."""
    exit_passed = waiters.exit_passed
    if exit_passed.is_set():
        raise StorageUnavailableError("the worker is stopping; nothing was processed")
    task = asyncio.ensure_future(work())
    stop = asyncio.ensure_future(exit_passed.wait())
    try:
        await asyncio.wait((task, stop), return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # the request cancelled: its work is not cut mid-statement
        _orphan(waiters, task)
        raise
    finally:
        stop.cancel()
    if task.done():
        return task.result()
    _orphan(waiters, task)
    return in_flight()


def _orphan(waiters: Waiters, task: asyncio.Task[Outcome]) -> None:
    """``task`` goes on with nobody awaiting it: kept referenced until it ends, and its
    exception, if any, retrieved (its request was answered already, or is gone)."""
    if task.done():
        if not task.cancelled():
            task.exception()
        return
    waiters.orphans.add(task)
    task.add_done_callback(_forget(waiters))


def _forget(waiters: Waiters) -> Callable[[asyncio.Task[Any]], None]:
    def done(task: asyncio.Task[Any]) -> None:
        waiters.orphans.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: its answer went out as in flight already

    return done
