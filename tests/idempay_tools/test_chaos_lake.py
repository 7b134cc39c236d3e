"""Which answered probe creates the chaos run's lake check exempts from "never logged"
(``idempay_tools._chaos_lake``, ``chaos.event_loss_windows``, ``chaos.storage_down_windows``).

Issue 22, session 7: the run at 6543518 (seed 7) failed with 2 answered probe creates never
logged. A create answered 503 while PostgreSQL was down has no request event when the worker
refused it before it knew the merchant (its cached API key had run out:
``tests/api/events/test_events_while_storage_down.py``); those are exempt now, and only
those: a 2xx answered in the same outage, or a 503 answered outside it, still counts.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from pathlib import Path

from idempay_tools._chaos_lake import ProbeCreate, check_lake, down_503, exempt
from idempay_tools.chaos import Fault, event_loss_windows, storage_down_windows
from tests.support.backend import Backend


def _create(at: float, status: int | None, after: float = 0.05) -> ProbeCreate:
    answered = status is not None
    return ProbeCreate(str(uuid.uuid4()), at, answered, status, at + after if answered else None)


def _crash(injected: float, healed: float, recovered: float | None) -> Fault:
    return Fault("postgres_restart", 0.0, 4.0, injected, True, healed, recovered)


def test_the_storage_down_window_runs_from_the_crash_to_the_first_success_after_it() -> None:
    faults = [
        _crash(100.0, 104.5, 106.0),
        Fault("worker_kill", 0.0, 0.0, 50.0, True, 50.4, 50.6),
        Fault("redis_restart", 0.0, 8.0, 200.0, True, 208.0, 208.1),
    ]
    assert storage_down_windows(faults) == [(99.0, 106.0)]  # 1 s before: met on the server


def test_only_a_503_for_a_create_sent_while_storage_was_down_is_exempt_as_such() -> None:
    down = storage_down_windows([_crash(100.0, 104.5, 106.0)])
    assert down_503(_create(101.0, 503), down)
    assert down_503(_create(99.5, 503), down)  # sent just before the crash, met it
    assert down_503(_create(105.9, 503), down)
    assert not down_503(_create(101.0, 201), down)  # answered 2xx: its event must be there
    assert not down_503(_create(101.0, 409), down)
    assert not down_503(_create(98.0, 503), down)  # a 503 before the outage counts
    assert not down_503(_create(106.5, 503), down)  # and one after the probe got through
    assert not down_503(_create(101.0, None), down)  # never answered: not counted anyway


def test_a_kill_or_restore_window_is_read_on_the_answer_time() -> None:
    """The event is queued when the create is answered: a slow create sent before the
    window but answered inside it may have lost its event; one answered before, not."""
    kill = Fault("worker_kill", 0.0, 0.0, 60.0, True, 60.5, 60.7)
    windows = event_loss_windows([kill], [(120.0, 130.0)])  # (dumped, API stopped)
    assert windows == [(55.0, 60.5), (119.0, 130.0)]
    assert exempt(_create(54.0, 201, after=1.5), windows)  # answered at 55.5
    assert not exempt(_create(53.0, 201, after=1.5), windows)  # answered at 54.5
    assert exempt(_create(117.5, 201, after=1.7), windows)  # answered 0.8 s before the dump
    assert not exempt(_create(117.5, 201, after=1.0), windows)
    assert not exempt(_create(130.5, 201), windows)  # the API is back on the restored one


def test_the_check_counts_what_is_exempt_and_what_is_lost(
    private_pg_backend: Backend, tmp_path: Path
) -> None:
    merchant = "chaos-probe-m"
    down = storage_down_windows([_crash(100.0, 104.5, 106.0)])
    logged_ok = _create(10.0, 201)
    lost_2xx = _create(20.0, 201)  # answered, no event: counted
    down_logged = _create(101.0, 503)
    down_lost = _create(101.25, 503)  # exempt: refused before the merchant was known
    lost_503 = _create(150.0, 503)  # a 503 outside any outage: counted
    in_outage_2xx = _create(101.5, 201)  # a 2xx in the outage without event: counted
    unanswered = _create(102.0, None)
    creates = [logged_ok, lost_2xx, down_logged, down_lost, lost_503, in_outage_2xx, unanswered]
    for create in (logged_ok, down_logged):
        private_pg_backend.sql(
            "INSERT INTO request_event (merchant_id, event_id, ts, terminal_id, "
            "idempotency_key, endpoint, outcome, http_status, latency_ms) VALUES "
            "(:m, :e, :ts, 'PROBE-1', :k, 'create', 'created', :s, 1.0)",
            m=merchant,
            e=str(uuid.uuid4()),
            ts=datetime.now(UTC),
            k=create.key,
            s=create.status,
        )
    assert private_pg_backend.database_url is not None
    result = asyncio.run(
        check_lake(
            private_pg_backend.database_url,
            tmp_path / "lake",
            probe_merchant=merchant,
            probe_creates=creates,
            exempt_windows=[],
            storage_down=down,
        )
    )
    assert result.probe_answered == 6
    assert result.probe_exempt == 2  # the two 503s of the outage
    assert (result.probe_down_503, result.probe_down_503_unlogged) == (2, 1)
    assert result.probe_unlogged == 3
    unlogged = {e.split()[4] for e in result.examples if "never logged" in e}
    assert unlogged == {lost_2xx.key, lost_503.key, in_outage_2xx.key}
