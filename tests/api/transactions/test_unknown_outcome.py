"""A write whose end was not seen (contract §2.2, "Decision": an unconfirmed end is 409 in
flight, never 503, unless the key is read back and shown absent):
``api.transactions.unknown_outcome.resolve``, the rule on its own. Creates cut past their
commit record on a real server (a synchronous standby that never answers, a backend
terminated or killed, a cluster crash) are in test_unknown_outcome_cluster.py.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from api.storage_errors import StorageUnavailableError
from api.transactions.unknown_outcome import (
    Applied,
    NotApplied,
    ReadBack,
    Unknown,
    resolve,
)

# --- the rule on its own -----------------------------------------------------------------


class _Reader:
    """A reader that fails ``failures`` times (storage unavailable), then answers ``found``;
    the write ends after ``running`` answered reads."""

    def __init__(self, found: dict[str, str], *, failures: int = 0, running: int = 0) -> None:
        self.found, self.failures, self.running, self.calls = found, failures, running, 0

    async def __call__(self, keys: Sequence[str]) -> ReadBack[str, str]:
        self.calls += 1
        if self.failures:
            self.failures -= 1
            raise StorageUnavailableError("restarting")
        ended = self.running == 0
        self.running = max(0, self.running - 1)
        return ReadBack({k: v for k, v in self.found.items() if k in keys}, ended)


def _mine(key: str, record: str) -> bool:
    return record == f"mine:{key}"


async def test_resolve_answers_each_key_from_what_is_stored() -> None:
    reader = _Reader({"a": "mine:a", "b": "theirs"})
    got = await resolve(["a", "b", "c"], reader, _mine, budget=1, pause=0.01)
    assert got == [Applied("mine:a"), NotApplied("theirs"), NotApplied(None)]


async def test_resolve_reads_again_while_the_database_comes_back() -> None:
    reader = _Reader({"a": "mine:a"}, failures=3)
    assert await resolve(["a", "b"], reader, _mine, budget=5, pause=0.01) == [
        Applied("mine:a"),
        NotApplied(None),
    ]
    assert reader.calls == 4


async def test_resolve_never_reached_is_unknown_for_every_key() -> None:
    reader = _Reader({"a": "mine:a"}, failures=10**6)
    assert await resolve(["a", "b"], reader, _mine, budget=0.2, pause=0.01) == [Unknown()] * 2


async def test_an_absent_key_is_unknown_while_the_write_may_still_commit() -> None:
    """Absent is final only once the cut write has ended: read again until then."""
    still = _Reader({"a": "mine:a"}, running=10**6)
    assert await resolve(["a", "b"], still, _mine, budget=0.2, pause=0.01) == [
        Applied("mine:a"),
        Unknown(),
    ]
    later = _Reader({}, running=2)
    assert await resolve(["b"], later, _mine, budget=5, pause=0.01) == [NotApplied(None)]
    assert later.calls == 3


async def test_budget_zero_reads_once_and_a_bug_is_not_swallowed() -> None:
    once = _Reader({}, failures=1)
    assert await resolve(["a"], once, _mine, budget=0) == [Unknown()]
    assert once.calls == 1

    async def broken(keys: Sequence[str]) -> ReadBack[str, str]:
        raise ValueError("a bug")

    with pytest.raises(ValueError):
        await resolve(["a"], broken, _mine, budget=1)
