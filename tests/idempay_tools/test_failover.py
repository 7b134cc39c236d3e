"""``make failover``'s short variant: a Patroni cluster with a synchronous standby loses
its primary (kill -9 of the postmaster) under a terminal fleet, the old primary rejoins,
and a planned switchover follows; every acknowledged payment is on the primary at the
end, exactly once. Runs etcd, two PostgreSQL nodes and Patroni of its own (chaos kind,
left out of ``make test-fast``); no timing is asserted."""

from __future__ import annotations

import argparse

from idempay_tools.failover import Mode


def test_a_killed_primary_with_a_sync_standby_loses_no_acknowledged_payment() -> None:
    args = argparse.Namespace(duration=45.0, terminals=4, seed=11, lag=2.0, keep=False)

    result = Mode(args, sync=True).run()

    failover, switchover = result.events
    assert (failover.kind, switchover.kind) == ("failover", "switchover")
    assert failover.new != failover.old and switchover.new == failover.old
    assert None not in (failover.promoted, failover.rejoined, switchover.rejoined)
    assert sum(result.outcomes.values()) > 0
    fleet = result.checks.fleet
    assert (fleet.lost, fleet.duplicates, fleet.journal_open) == (0, 0, 0), fleet.violations
    assert fleet.ok and result.checks.probe.ok
    assert result.drained.processing_left == 0
    assert result.checks.outbox.unsent == 0 and result.checks.outbox.seq_gaps == 0
    assert 500 not in result.checks.status_5xx
    assert result.errors == []
