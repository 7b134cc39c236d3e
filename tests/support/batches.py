"""A batch of a ``GroupCommit`` built on purpose, and the statements it sends: for the tests
of the set statements a batch writes (one INSERT of claims, one UPDATE of finishes, the
finishes' rows one INSERT per table)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from api.transactions.group_commit import GroupCommit


@contextmanager
def statements_sent(engine: AsyncEngine) -> Iterator[list[str]]:
    """Each INSERT and UPDATE statement sent on ``engine`` while inside, as ``INSERT
    <table>`` / ``UPDATE <table>``."""
    sent: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        words = statement.split()
        verb = words[0].upper() if words else ""
        if verb == "INSERT":
            sent.append(f"INSERT {words[2].strip(chr(34))}")
        elif verb == "UPDATE":
            sent.append(f"UPDATE {words[1].strip(chr(34))}")

    event.listen(engine.sync_engine, "before_cursor_execute", record)
    try:
        yield sent
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", record)


async def one_batch(group: GroupCommit[Any], works: list[Any]) -> list[Any]:
    """``works`` written by ``group`` in one batch: they queue while a first work holds its
    only lane. Each work's result, or the exception it got."""
    group.lanes = group.max_lanes = 1
    gate, started = asyncio.Event(), asyncio.Event()

    async def held(_conn: AsyncConnection) -> str:
        started.set()
        await gate.wait()
        return "held"

    first = asyncio.ensure_future(group.run(held))
    await started.wait()
    rest = [asyncio.ensure_future(group.run(work)) for work in works]
    await asyncio.sleep(0)
    assert len(group._pending) == len(works)  # queued behind the held batch, together
    gate.set()
    assert await first == "held"
    return list(await asyncio.gather(*rest, return_exceptions=True))
