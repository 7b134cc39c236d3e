"""The failover harness's cluster start (``idempay_tools._failover_cluster``): it waits on
the cluster's own state (Patroni's ``/cluster``), and a Patroni whose bootstrap fails — its
PostgreSQL cannot bind the port it was given, as when another process took that port
meanwhile on a busy machine — exits, and is started again on new ports instead of being
waited on until the bound. Runs etcd, Patroni and PostgreSQL of its own (chaos kind)."""

from __future__ import annotations

import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from idempay_tools._failover_cluster import PatroniCluster


@pytest.fixture
def cluster() -> Iterator[PatroniCluster]:
    root = Path(tempfile.mkdtemp(prefix="idempay-failover-boot-"))
    root.chmod(0o755)  # the postgres user reaches its nodes' folders
    running = PatroniCluster(root, sync=True)
    try:
        yield running
    finally:
        running.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_a_bootstrap_whose_postgres_cannot_bind_its_port_starts_again_on_new_ports(
    cluster: PatroniCluster,
) -> None:
    pg0 = cluster.node("pg0")
    taken = pg0.pg_port
    with socket.socket() as holder:  # the port pg0 was given, taken by someone else
        holder.bind(("127.0.0.1", taken))
        holder.listen()

        cluster.start()

        assert pg0.pg_port != taken
        roles = sorted((m["name"], m["role"]) for m in cluster.members())
        assert roles == [("pg0", "leader"), ("pg1", "sync_standby")]


def test_a_replica_whose_postgres_cannot_bind_its_port_starts_again_on_new_ports(
    cluster: PatroniCluster,
) -> None:
    """A replica's Patroni does not exit when its PostgreSQL cannot start: it reports
    "start failed" and retries on the same port for ever (seen in CI: pg1 given the port
    pg0's REST API had taken). It is stopped and started again on new ports."""
    pg1 = cluster.node("pg1")
    taken = pg1.pg_port
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", taken))
        holder.listen()

        cluster.start()

        assert pg1.pg_port != taken
        roles = sorted((m["name"], m["role"]) for m in cluster.members())
        assert roles == [("pg0", "leader"), ("pg1", "sync_standby")]


def test_ports_given_one_after_the_other_are_never_the_same() -> None:
    """The kernel hands a just-released port out again; ``free_port`` never gives this
    process one it gave before (CI: a node's new PostgreSQL port was the port another
    node's REST API had been given)."""
    from idempay_tools.serve_process import free_port

    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
