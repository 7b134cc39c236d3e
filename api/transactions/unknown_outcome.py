"""Unknown commit outcomes: a write whose end nobody saw is answered from what is stored.

A write statement cut while it ran — the connection lost, the backend terminated
(SQLSTATE 57P01 admin_shutdown, 57P02 crash_shutdown), the connection reset, a wait for a
synchronous standby cut short — may have committed: its commit record can be in the WAL
before the session dies. "Nothing was processed" (503) is then a guess, and a wrong one for
every write that did commit. The rule (contract §2.2): such a write is answered from its
keys read back; a key whose write shows applied is answered as written, a key holding
another's row by that row, a key shown absent — once the cut write can no longer commit — as
not processed (503, true now); a key still unknown when the read-back's budget is spent is
answered in flight (409 ``request_in_progress``, ``Retry-After``: look it up).

This module holds that rule and nothing of any one write: ``resolve`` takes the keys, a
``reader`` that reads them back (and says whether the cut write has ended) and an
``applied`` test (is this stored row the write's own?), and answers, per key, ``Applied``,
``NotApplied`` (another's row, or none) or ``Unknown``. A claim cut mid-statement
(``TransactionService._claim_unseen``) uses it; any other write — a finish — whose end is
unseen can use it the same way.

- **Reads are retried, within a budget.** The database may be restarting (crash recovery
  refuses connections for a moment): the reader is called again every ``pause`` until it
  answers, for at most ``budget`` seconds in all (each attempt is cut at the budget's end).
  A reader failing for want of storage (``StorageUnavailableError``) is retried; any other
  error is a bug and propagates.
- **Absent is final only once the write has ended.** A write whose session still runs (a
  client-side connection loss: the server goes on with the statement) can still commit: an
  absent key is then ``Unknown`` — read again until the write has ended or the budget is
  spent. The reader says which (``ReadBack.ended``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from api.storage_errors import StorageUnavailableError

K = TypeVar("K", bound=Hashable)
R = TypeVar("R")

# How long a request waits, in all, for its keys to be read back after an unknown outcome
# (the database restarting, a failover): a couple of seconds, then "in flight" (409).
READ_BACK_S = 2.0
PAUSE_S = 0.1  # between two attempts of the read


class CommitOutcomeUnknown(StorageUnavailableError):
    """A write statement was cut before its end was seen: it may have committed.
    ``session``: what identifies the server session that ran it (a Postgres backend's pid),
    for a reader that asks whether that session still runs; None when unknown. Caught by a
    write's caller, it is answered through ``resolve``; uncaught (a read), it is a plain 503
    — a read processed nothing."""

    def __init__(self, why: str, *, session: int | None = None) -> None:
        super().__init__(f"outcome unknown: {why}")
        self.session = session


@dataclass(frozen=True)
class ReadBack(Generic[K, R]):
    """One read of the keys: the stored rows found (by key) and whether the cut write has
    ended — it can no longer commit, so a key absent now stays absent."""

    found: Mapping[K, R]
    ended: bool = True


@dataclass(frozen=True)
class Applied(Generic[R]):
    """The write committed: its own row is stored."""

    record: R


@dataclass(frozen=True)
class NotApplied(Generic[R]):
    """The write did not commit: the key holds another's row (``record``), or nothing."""

    record: R | None


@dataclass(frozen=True)
class Unknown:
    """Still unknown when the budget was spent: answer in flight (409, look up)."""


Outcome = Applied[R] | NotApplied[R] | Unknown
Reader = Callable[[Sequence[K]], Awaitable[ReadBack[K, R]]]


async def resolve(
    keys: Sequence[K],
    reader: Reader[K, R],
    applied: Callable[[K, R], bool],
    *,
    budget: float = READ_BACK_S,
    pause: float = PAUSE_S,
) -> list[Outcome[R]]:
    """Each key's outcome, in ``keys``' order (module docstring). ``budget`` 0: one attempt."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + budget
    last: ReadBack[K, R] | None = None
    while True:
        try:
            async with asyncio.timeout_at(deadline if budget > 0 else None):
                last = await reader(keys)
        except (StorageUnavailableError, TimeoutError):
            pass  # not reachable yet (restarting, failing over): again, within the budget
        if last is not None and (last.ended or all(key in last.found for key in keys)):
            break
        if loop.time() + pause >= deadline:
            break
        await asyncio.sleep(pause)
    return [_outcome(key, last, applied) for key in keys]


def _outcome(key: K, read: ReadBack[K, R] | None, applied: Callable[[K, R], bool]) -> Outcome[R]:
    if read is None:
        return Unknown()  # never read: nothing is known
    record = read.found.get(key)
    if record is None:
        return NotApplied(None) if read.ended else Unknown()
    return Applied(record) if applied(key, record) else NotApplied(record)
