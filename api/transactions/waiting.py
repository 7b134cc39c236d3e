"""``Prefer: wait=N`` on create, lookup and abort (contract §2, issue 17).

A request that finds its key in flight — a duplicate create answered 409
``request_in_progress``, a lookup answered 202 ``processing``, an abort answered 409 — and
asked ``Prefer: wait=N`` is held until the key settles or ``N`` seconds pass (``N`` capped
at ``IDEMPAY_PREFER_WAIT_MAX``), then answered as usual by looking again: the replay, the
transaction, the fence — or, at the time limit, the same in-flight answer with
``Retry-After``. ``Preference-Applied: wait=N`` says it waited.

Only in-flight answers wait. The create that claimed the key itself and whose issuer call
timed out still answers 202 at once (its request event stays ``created``: the audit counts
that key once); its duplicates and lookups wait. When this worker's waiting table is full
the request is answered at once, as without the preference.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from api.events.writer import RequestOutcome
from api.idempotency.waiters import Waiters, WaitersFull
from api.transactions.outcome import IdempotencyStatus, Outcome

IN_FLIGHT_EVENTS = frozenset({RequestOutcome.IN_PROGRESS, RequestOutcome.PROCESSING})


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
    first: Outcome,
    again: Callable[[], Awaitable[Outcome]],
) -> tuple[Outcome, bool]:
    """``first`` or, if it is in flight and ``seconds`` > 0, the answer once the key has
    settled (or the last look at the time limit); and whether the request waited."""
    if seconds <= 0 or not in_flight(first):
        return first, False
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    try:
        with waiters.watch(merchant_id, key) as settled:
            outcome = await again()  # registered first: a settlement now is not missed
            while in_flight(outcome):
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                try:
                    await asyncio.wait_for(settled.wait(), remaining)
                except TimeoutError:
                    return await again(), True
                settled.clear()
                outcome = await again()
    except WaitersFull:
        return first, False
    return outcome, True
