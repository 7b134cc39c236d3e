"""The chaos harness's bounds (issue 22) without running it: the phase budgets derived from
the duration, the SIGALRM backstop that interrupts a phase blocked past its deadline and
names it, and the PID registry that stops only the processes the run started."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from idempay_tools._chaos_budget import Overrun, Timeline, budgets, total_budget
from idempay_tools._chaos_reaper import Registry, start_time, sweep


def test_the_short_run_is_bounded_below_its_test_timeout() -> None:
    assert total_budget(90) == pytest.approx(530)
    assert total_budget(300) == pytest.approx(840)
    assert budgets(90)["fleet"] == 210 and budgets(300)["fleet"] == 450
    from tests.idempay_tools.test_chaos import TIMEOUT_S

    assert total_budget(90) + 60 < TIMEOUT_S  # the harness always ends (and cleans up) first


def test_a_phase_blocked_past_its_deadline_is_interrupted_and_named() -> None:
    timeline = Timeline(30, total_s=60, alarm_grace_s=0.2)
    timeline.budgets["drain"] = 0.3
    started = time.monotonic()
    overran = pytest.raises(Overrun, match="phase 'drain' overran its 0 s budget")
    with overran as raised, timeline.phase("drain"):
        time.sleep(10)  # stands for any call that does not return
    assert time.monotonic() - started < 5
    assert raised.value.phase == "drain"
    assert timeline.phases[-1].overran and "interrupted" in timeline.phases[-1].overran
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)  # disarmed after the phase


def test_waits_end_at_the_phase_deadline_and_never_past_the_run() -> None:
    timeline = Timeline(30, total_s=5)
    with timeline.phase("settle"):
        assert 4 < timeline.left() <= 5  # the run's deadline, not settle's 90 s
        assert timeline.left(1.5) == 1.5
        assert not timeline.expired()
    assert "settle" in timeline.rows()[0]


def test_sweep_stops_registered_processes_and_nothing_else(tmp_path: Path) -> None:
    ours = subprocess.Popen(["sleep", "60"], start_new_session=True)
    other = subprocess.Popen(["sleep", "60"])
    try:
        registry = Registry(tmp_path)
        registry.add(ours.pid, "ours", group=True)
        with registry.path.open("a") as out:  # a PID reused by another process since
            out.write(f"{other.pid} 1 0 reused\n")
        assert [t.label for t in registry.running()] == ["ours"]
        assert sweep(tmp_path, grace_s=2.0) == [f"ours (pid {ours.pid})"]
        assert ours.wait(5) == -signal.SIGTERM
        assert other.poll() is None and start_time(other.pid) is not None
    finally:
        ours.kill()
        other.kill()
        other.wait()
