"""The chaos run's one fault schedule (``idempay_tools.chaos.plan``): the acquirer's episodes
are laid out in it, one at a time, never inside a quiet window — the time of a server fault
whose checks assume a reachable acquirer (the link outage until its stored payments are
forwarded, the noisy neighbour until its victims are final) — and the run keeps that rule
when a fault runs late (``Run._blocker``). Before, the episodes were drawn on a schedule of
their own: an acquirer outage overlapped the link outage (no terminal sold offline) and the
noisy neighbour (victims past the 30 s deadline)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from idempay_tools._chaos_acquirer import ACQUIRER_KINDS, EPISODE_TAIL_S, OUTAGE_S
from idempay_tools.chaos import KINDS, NEEDS_ACQUIRER, Fault, Run, plan, quiet_windows

RUNS = [(d, s) for d in (30, 60, 90, 150, 300, 600) for s in (1, 3, 7, 11, 42)]


def _episodes(faults: list[Fault]) -> list[Fault]:
    return sorted((f for f in faults if f.kind in ACQUIRER_KINDS), key=lambda f: f.at_s)


@pytest.mark.parametrize(("duration", "seed"), RUNS)
def test_no_episode_in_a_quiet_window_and_one_at_a_time(duration: float, seed: int) -> None:
    faults = plan(duration, seed)
    server = [f for f in faults if f.kind not in ACQUIRER_KINDS]
    episodes = _episodes(faults)
    assert sorted(f.kind for f in episodes) == sorted(ACQUIRER_KINDS)
    assert {f.kind for f in server} == set(KINDS)
    quiet = quiet_windows(server)
    assert len(quiet) == sum(1 for f in server if f.kind in NEEDS_ACQUIRER)
    warmup = min(15.0, duration * 0.1)
    for episode in episodes:
        start, end = episode.at_s, episode.at_s + episode.hold_s + EPISODE_TAIL_S
        assert start >= warmup and episode.hold_s > 0
        for q_start, q_end in quiet:
            assert end <= q_start or start >= q_end, (episode, (q_start, q_end))
    for before, after in zip(episodes, episodes[1:], strict=False):
        assert before.at_s + before.hold_s + EPISODE_TAIL_S <= after.at_s, (before, after)


@pytest.mark.parametrize("seed", [1, 7, 11])
def test_a_long_run_keeps_the_full_outage_inside_its_duration(seed: int) -> None:
    episodes = _episodes(plan(300, seed))
    outage = next(f for f in episodes if f.kind == "acquirer_outage")
    assert outage.hold_s == OUTAGE_S
    assert all(f.at_s + f.hold_s + EPISODE_TAIL_S <= 300 for f in episodes)


def _run(faults: list[Fault], running: list[Fault]) -> Any:
    """What ``Run._blocker`` reads of a run."""
    return SimpleNamespace(
        faults=faults,
        running=running,
        started=0.0,
        _is_running=lambda f: any(r is f for r in running),
    )


def test_an_episode_and_a_late_noisy_neighbour_never_run_at_once() -> None:
    noisy = Fault("noisy_neighbour", 40.0, 5.0)
    outage = Fault("link_outage", 10.0, 6.0, finished=True)
    episode = Fault("acquirer_outage", 60.0, 10.0)
    faults = [outage, noisy, episode]
    # the neighbour (due at 40 s) runs late and has not begun at 62 s: the first to begin
    # goes first, the other waits until it has finished
    assert Run._blocker(_run(faults, []), episode, 62.0) is None
    assert Run._blocker(_run(faults, [episode]), noisy, 62.0) is episode
    assert Run._blocker(_run(faults, [noisy]), episode, 62.0) is noisy
    assert Run._blocker(_run(faults, []), noisy, 62.0) is None
    # a server fault that needs no acquirer never waits; the link outage cannot
    restart = Fault("postgres_restart", 61.0, 2.0)
    assert Run._blocker(_run([*faults, restart], [episode]), restart, 62.0) is None
    assert Run._blocker(_run(faults, [episode]), Fault("link_outage", 62.0, 5.0), 62.0) is None


def test_an_episode_keeps_out_of_the_link_outage_until_it_is_forwarded() -> None:
    outage = Fault("link_outage", 10.0, 6.0)  # down 10-16 s, then forwarding
    episode = Fault("acquirer_kill", 3.0, 2.0)  # ran late: would still be on at 10 s
    assert Run._blocker(_run([outage, episode], []), episode, 5.0) is outage
    assert Run._blocker(_run([outage, episode], []), episode, 3.0) is None  # over by 9 s
    assert Run._blocker(_run([outage, episode], [outage]), episode, 20.0) is outage
    outage.finished = True
    assert Run._blocker(_run([outage, episode], []), episode, 20.0) is None
