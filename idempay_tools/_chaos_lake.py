"""The chaos run's request-event checks (issue 22): after the final export, every request
event that reached the database is in the lake exactly once, no event id appears twice,
and every create the probe got an answer to was logged exactly once.

The probe sends each key once, straight to the API, so its creates are the run's ground
truth for the event writer: an answered create with no event is an event lost on the way
to the database (a graceful shutdown that dropped its batch), one with two events was
written twice (a retried flush under new ids). Exempt from "never logged" (never from
"logged twice"), by the time the create was *answered* (its event is queued then):

- a SIGKILLed worker's unflushed events: creates answered in the few seconds before a
  worker kill (``chaos.event_loss_windows``);
- whatever a database restore takes back: creates answered from just before the dump to
  the API's stop;
- a create answered **503 while storage was down** (``storage_down``: from a Postgres
  crash until the probe's first success after it). A worker answers 503 *before it knows
  the merchant* when the caller's API key is not in its cache (a new worker, or the
  entry's minute, ``api.auth.CACHE_SECONDS``, ran out during the outage): the key lookup
  fails, and a request event has no row without a merchant (``merchant_id`` is part of
  ``request_event``'s key), so that create is never logged. From outside such a 503 looks
  like one answered after the merchant was known (whose event is queued and written when
  the database is back: ``tests/api/events/test_events_while_storage_down.py`` checks
  that one with a real server), so every 503 of the outage is exempt, and counted
  (``probe_down_503``, ``probe_down_503_unlogged``) in the report.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import func, select

EVENT_DATE = re.compile(r"^event_date=\d{4}-\d{2}-\d{2}$")


@dataclass(frozen=True, slots=True)
class ProbeCreate:
    key: str
    at: float  # monotonic, when it was sent
    answered: bool  # an HTTP answer came back (any status)
    status: int | None = None  # the answer's HTTP status
    answered_at: float | None = None  # monotonic, when the answer came back


@dataclass(frozen=True, slots=True)
class LakeCheck:
    db_events: int
    lake_events: int
    missing_from_lake: int  # event ids in the database, not in the lake
    twice_in_lake: int  # event ids more than once in the lake
    probe_answered: int
    probe_exempt: int
    probe_unlogged: int  # answered probe creates with no create event
    probe_logged_twice: int  # probe creates with two or more create events
    examples: tuple[str, ...] = ()
    probe_down_503: int = 0  # exempt only as answered 503 while storage was down
    probe_down_503_unlogged: int = 0  # … of them with no create event

    def rows(self) -> list[tuple[str, int]]:
        return [
            ("request events in the database missing from the lake", self.missing_from_lake),
            ("event ids twice in the lake", self.twice_in_lake),
            ("answered probe creates never logged", self.probe_unlogged),
            ("probe creates logged twice", self.probe_logged_twice),
        ]


def lake_event_ids(lake: Path) -> list[str]:
    """Every ``event_id`` in the lake's request_events partitions (every Parquet file)."""
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    ids: list[str] = []
    table_dir = lake / "request_events"
    if not table_dir.is_dir():
        return ids
    for partition in sorted(table_dir.iterdir()):
        if not (partition.is_dir() and EVENT_DATE.match(partition.name)):
            continue
        for part in sorted(partition.rglob("*.parquet")):
            ids.extend(pq.read_table(part, columns=["event_id"]).column(0).to_pylist())
    return ids


def _described(create: ProbeCreate, origin: float) -> str:
    """The key, when it was sent (seconds from ``origin``, the fleet's start) and answered."""
    said = f"{create.key} (sent at {create.at - origin:.2f} s"
    if create.answered_at is not None:
        said += f", answered {create.status} after {create.answered_at - create.at:.2f} s"
    return said + ")"


def answered_at(create: ProbeCreate) -> float:
    """When its event was queued: when the answer came back (else when it was sent)."""
    return create.at if create.answered_at is None else create.answered_at


def exempt(create: ProbeCreate, windows: Sequence[tuple[float, float]]) -> bool:
    """Answered within a window of documented loss (a worker kill's, a restore's)."""
    at = answered_at(create)
    return any(start <= at <= end for start, end in windows)


def down_503(create: ProbeCreate, storage_down: Sequence[tuple[float, float]]) -> bool:
    """Answered 503 for a create sent while storage was down: the worker may have refused
    it before it knew the merchant (the module docstring), so it may have no event."""
    return create.status == 503 and any(start <= create.at <= end for start, end in storage_down)


async def check_lake(
    database_url: str,
    lake: Path,
    *,
    probe_merchant: str,
    probe_creates: Sequence[ProbeCreate],
    exempt_windows: Sequence[tuple[float, float]],
    storage_down: Sequence[tuple[float, float]] = (),
    origin: float = 0.0,
) -> LakeCheck:
    from api.config import Settings
    from api.db import create_engine
    from api.models import RequestEvent

    engine = create_engine(Settings(database_url=database_url))
    try:
        async with engine.connect() as conn:
            db_ids = set((await conn.execute(select(RequestEvent.event_id))).scalars())
            rows = await conn.execute(
                select(RequestEvent.idempotency_key, func.count())
                .where(
                    RequestEvent.merchant_id == probe_merchant,
                    RequestEvent.endpoint == "create",
                )
                .group_by(RequestEvent.idempotency_key)
            )
            logged = {str(key): int(n) for key, n in rows.all()}
    finally:
        await engine.dispose()
    in_lake = Counter(lake_event_ids(lake))
    missing = db_ids - in_lake.keys()
    answered = [c for c in probe_creates if c.answered]
    in_window = [c for c in answered if not exempt(c, exempt_windows)]
    down = [c for c in in_window if down_503(c, storage_down)]
    counted = [c for c in in_window if not down_503(c, storage_down)]
    unlogged = [c for c in counted if logged.get(c.key, 0) == 0]
    twice = [key for key, n in logged.items() if n > 1]
    examples = [f"not in the lake: {i}" for i in sorted(missing)[:5]]
    examples += [f"probe create never logged: {_described(c, origin)}" for c in unlogged[:5]]
    examples += [f"probe create logged {logged[k]} times: {k}" for k in twice[:5]]
    return LakeCheck(
        db_events=len(db_ids),
        lake_events=sum(in_lake.values()),
        missing_from_lake=len(missing),
        twice_in_lake=sum(1 for n in in_lake.values() if n > 1),
        probe_answered=len(answered),
        probe_exempt=len(answered) - len(counted),
        probe_unlogged=len(unlogged),
        probe_logged_twice=len(twice),
        examples=tuple(examples),
        probe_down_503=len(down),
        probe_down_503_unlogged=sum(1 for c in down if logged.get(c.key, 0) == 0),
    )
