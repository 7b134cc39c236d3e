"""The failover harness's HA database: a private etcd and two PostgreSQL nodes managed by
Patroni, all on free loopback ports, all under one temporary folder.

- ``Etcd``: one ``etcd`` member (the DCS); Patroni talks to it over the v3 API.
- ``PatroniNode``: one ``patroni`` daemon (run as the ``postgres`` user when we are root)
  and the PostgreSQL cluster it manages (``initdb`` on the first leader, ``pg_basebackup``
  on the other; ``pg_rewind`` when a demoted primary has diverged).
- ``PatroniCluster``: the two nodes, read through Patroni's REST API (``/cluster``):
  who leads, who is the synchronous standby, the timeline; ``kill_postmaster()`` SIGKILLs
  the leader's postmaster, ``stall_replication()`` SIGSTOPs the leader's WAL sender (the
  replication link stalls), ``switchover()`` asks Patroni for a planned one.

``database_url`` names both nodes: ``host=A&host=B&target_session_attrs=read-write``;
asyncpg tries them in order and keeps the one that accepts writes.

``bootstrap.dcs`` is Patroni's cluster-wide configuration: ``synchronous_mode`` (a commit
is acknowledged only once the synchronous standby has it), ``primary_start_timeout: 0``
(a crashed primary fails over instead of restarting in place), ``use_pg_rewind``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from idempay_tools._chaos_services import pg_bin
from idempay_tools.serve_process import free_port

LOCAL = "127.0.0.1"
TTL_S, LOOP_WAIT_S, RETRY_TIMEOUT_S = 20, 2, 5
# From etcd up to a streaming standby: ~20 s here, minutes on a loaded two-core machine
# (initdb, the first checkpoint and pg_basebackup compete with everything else running).
BOOTSTRAP_S = 300.0
BOOTSTRAP_ATTEMPTS = 3  # a failed bootstrap (Patroni exits or its PostgreSQL fails): new ports


class NodeExited(RuntimeError):
    """A Patroni daemon exited while the cluster waited on it."""


__all__ = ["Etcd", "NodeExited", "PatroniCluster", "PatroniNode"]


def _tail(path: Path, size: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-size:]
    except OSError:
        return ""


def _stop(proc: subprocess.Popen[bytes] | None, *, timeout: float = 30.0) -> None:
    """SIGTERM the process we started, SIGKILL it if it does not go."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


class Etcd:
    """One private etcd member on loopback ports, data under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root / "etcd"
        self.client_port, self.peer_port = free_port(), free_port()
        self.log = self.root / "etcd.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, *, timeout: float = 30.0) -> None:
        etcd = shutil.which("etcd")
        if etcd is None:
            raise RuntimeError("failover: etcd not found (apt-get install etcd-server)")
        self.root.mkdir(parents=True)
        client, peer = f"http://{LOCAL}:{self.client_port}", f"http://{LOCAL}:{self.peer_port}"
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [etcd, "--name", "failover", "--data-dir", str(self.root / "data"),
                 "--listen-client-urls", client, "--advertise-client-urls", client,
                 "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                 "--initial-cluster", f"failover={peer}", "--unsafe-no-fsync"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{client}/health", timeout=1.0) as answer:
                    if answer.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        raise RuntimeError(f"failover: etcd did not start:\n{_tail(self.log)}")

    def stop(self) -> None:
        _stop(self.proc)


class PatroniNode:
    """One ``patroni`` daemon and the PostgreSQL it manages."""

    def __init__(self, root: Path, name: str, *, scope: str, etcd: Etcd, sync: bool) -> None:
        self.name = name
        self.root = root / name
        self.data = self.root / "data"
        self.pg_port, self.rest_port = free_port(), free_port()
        self.log = self.root / "patroni.log"
        self.config = self.root / "patroni.yml"
        self.proc: subprocess.Popen[bytes] | None = None
        self._scope, self._etcd, self._sync = scope, etcd, sync

    @property
    def rest(self) -> str:
        return f"http://{LOCAL}:{self.rest_port}"

    def _settings(self) -> dict[str, Any]:
        trust = [f"{kind} {db} all 127.0.0.1/32 trust" for kind, db in
                 (("host", "all"), ("host", "replication"))]  # fmt: skip
        return {
            "scope": self._scope,
            "namespace": "/idempay-failover/",
            "name": self.name,
            "log": {"level": "INFO", "dir": str(self.root), "file_size": 50_000_000},
            "restapi": {
                "listen": f"{LOCAL}:{self.rest_port}",
                "connect_address": f"{LOCAL}:{self.rest_port}",
            },  # fmt: skip
            "etcd3": {"hosts": [f"{LOCAL}:{self._etcd.client_port}"]},
            "bootstrap": {
                "dcs": {
                    "ttl": TTL_S,
                    "loop_wait": LOOP_WAIT_S,
                    "retry_timeout": RETRY_TIMEOUT_S,
                    "maximum_lag_on_failover": 16 * 1024 * 1024,
                    "synchronous_mode": self._sync,
                    "primary_start_timeout": 0,
                    "postgresql": {
                        "use_pg_rewind": True,
                        "use_slots": True,
                        "parameters": {
                            "max_connections": 100,
                            "shared_buffers": "64MB",
                            "wal_keep_size": "256MB",
                            "hot_standby": "on",
                        },
                    },  # fmt: skip
                },
                "initdb": [{"encoding": "UTF8"}, {"auth": "trust"}],
                "pg_hba": ["local all all trust", *trust],
            },
            "postgresql": {
                "listen": f"{LOCAL}:{self.pg_port}",
                "connect_address": f"{LOCAL}:{self.pg_port}",
                "data_dir": str(self.data),
                "bin_dir": str(pg_bin()),
                "pgpass": str(self.root / "pgpass"),
                "authentication": {
                    "superuser": {"username": "postgres", "password": "failover"},
                    "replication": {"username": "replicator", "password": "failover"},
                },
                "parameters": {"unix_socket_directories": str(self.root)},
                "pg_hba": ["local all all trust", *trust],
            },
            "tags": {"nofailover": False, "noloadbalance": False},
        }

    def new_ports(self) -> None:
        self.pg_port, self.rest_port = free_port(), free_port()

    def exited(self) -> bool:
        return self.proc is not None and self.proc.poll() is not None

    def start(self) -> None:
        patroni = shutil.which("patroni")
        if patroni is None:
            raise RuntimeError("failover: patroni not found (apt-get install patroni)")
        self.root.mkdir(parents=True, exist_ok=True)
        self.config.write_text(json.dumps(self._settings(), indent=1))  # JSON is YAML
        command = [patroni, str(self.config)]
        if os.geteuid() == 0:  # PostgreSQL refuses to run as root
            shutil.chown(self.root, "postgres", "postgres")
            for path in self.root.rglob("*"):
                shutil.chown(path, "postgres", "postgres")
            command = ["runuser", "-u", "postgres", "--", *command]
        with (self.root / "patroni.out").open("ab") as out:
            self.proc = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def postmaster_pid(self) -> int | None:
        try:
            pid = int((self.data / "postmaster.pid").read_text().split()[0])
            os.kill(pid, 0)
            return pid
        except (OSError, ValueError, IndexError):
            return None

    def children(self, pid: int, label: str) -> list[int]:
        """The postmaster's children whose title holds ``label`` (e.g. ``walsender``)."""
        try:
            kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            return []
        found = []
        for kid in map(int, kids):
            try:
                title = Path(f"/proc/{kid}/cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            if label.encode() in title:
                found.append(kid)
        return found

    def stop(self) -> None:
        """Patroni stops its PostgreSQL on SIGTERM; whatever is left gets SIGKILL."""
        _stop(self.proc, timeout=40.0)
        pid = self.postmaster_pid()
        if pid is not None:
            for kid in self.children(pid, "postgres"):
                os.kill(kid, signal.SIGKILL)
            os.kill(pid, signal.SIGKILL)


class PatroniCluster:
    """Two Patroni nodes on one etcd; ``sync`` turns ``synchronous_mode`` on."""

    def __init__(self, root: Path, *, sync: bool) -> None:
        self.root = root
        self.etcd = Etcd(root)
        scope = f"idempay-{root.name}"
        self.nodes = [
            PatroniNode(root, f"pg{i}", scope=scope, etcd=self.etcd, sync=sync) for i in (0, 1)
        ]
        self.sync = sync

    @property
    def database_url(self) -> str:
        hosts = "&".join(f"host={LOCAL}:{n.pg_port}" for n in self.nodes)
        return f"postgresql+asyncpg://postgres@/postgres?{hosts}&target_session_attrs=read-write"

    def node(self, name: str) -> PatroniNode:
        return next(n for n in self.nodes if n.name == name)

    def start(self, *, timeout: float = BOOTSTRAP_S) -> None:
        """etcd, then pg0 until Patroni's ``/cluster`` names it leader, then pg1 until it
        streams as the (synchronous) standby, all within ``timeout``."""
        deadline = time.monotonic() + timeout
        self.etcd.start()
        self._bootstrap(self.nodes[0], lambda m: self._role(m, "pg0") == "leader", deadline,
                        "pg0 to lead")  # fmt: skip
        want = "sync_standby" if self.sync else "replica"
        self._bootstrap(self.nodes[1], lambda m: self._streaming(m, "pg1", want), deadline,
                        f"pg1 as {want}")  # fmt: skip

    def _bootstrap(self, node: PatroniNode, done: Any, deadline: float, what: str) -> None:
        """Start ``node`` and wait for the cluster's state ``done``. A Patroni whose
        bootstrap fails (its PostgreSQL did not come up, e.g. its port was taken meanwhile)
        cancels the attempt in etcd and exits; a replica's reports "start failed" and is
        stopped. Either is started again, on new ports."""
        for attempt in range(1, BOOTSTRAP_ATTEMPTS + 1):
            node.start()
            try:
                self.wait(done, deadline - time.monotonic(), what, watch=node)
                return
            except NodeExited:
                if attempt == BOOTSTRAP_ATTEMPTS:
                    raise
                node.new_ports()

    def members(self) -> list[dict[str, Any]]:
        """Patroni's view of the cluster (``GET /cluster`` on the first node that answers)."""
        for node in self.nodes:
            try:
                with urllib.request.urlopen(f"{node.rest}/cluster", timeout=1.0) as answer:
                    return list(json.loads(answer.read())["members"])
            except (urllib.error.URLError, OSError, ValueError, KeyError):
                continue
        return []

    @staticmethod
    def _state(members: list[dict[str, Any]], name: str) -> str | None:
        return next((m.get("state") for m in members if m.get("name") == name), None)

    @staticmethod
    def _role(members: list[dict[str, Any]], name: str) -> str | None:
        return next((m.get("role") for m in members if m.get("name") == name), None)

    @staticmethod
    def _streaming(members: list[dict[str, Any]], name: str, role: str) -> bool:
        return any(
            m.get("name") == name
            and m.get("role") == role
            and m.get("state") in ("running", "streaming")  # Patroni 3.0 says running
            and isinstance(m.get("lag"), int)
            for m in members
        )

    def leader(self) -> dict[str, Any] | None:
        return next((m for m in self.members() if m.get("role") == "leader"), None)

    def wait(
        self, done: Any, timeout: float, what: str, *, watch: PatroniNode | None = None
    ) -> float:
        """Poll ``/cluster`` until ``done(members)``; the monotonic time it held. With
        ``watch``, fails at once (``NodeExited``) if that node's Patroni exits."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            members = self.members()
            if done(members):
                return time.monotonic()
            if watch is not None and watch.exited():
                raise NodeExited(f"failover: {watch.name}'s Patroni exited waiting for "
                                 f"{what}:\n{self._logs()}")  # fmt: skip
            if watch is not None and self._state(members, watch.name) == "start failed":
                # A replica's Patroni does not exit when its PostgreSQL cannot start
                # (e.g. its port taken by another process): it retries on that port
                # for ever. Stop it and drop its copy of the leader (stopping it wrote a
                # shutdown checkpoint past the leader's WAL, which a restarted standby then
                # waits on for ever); it is started again on new ports and copies afresh.
                watch.stop()
                shutil.rmtree(watch.data, ignore_errors=True)
                raise NodeExited(f"failover: {watch.name}'s PostgreSQL failed to start "
                                 f"waiting for {what}:\n{self._logs()}")  # fmt: skip
            time.sleep(0.2)
        raise RuntimeError(
            f"failover: timed out after {timeout:.0f} s waiting for {what}: "
            f"{self.members()}\n{self._logs()}"
        )

    def _logs(self) -> str:
        return "\n".join(
            f"--- {n.name}\n{_tail(n.root / 'patroni.log')}{_tail(n.root / 'patroni.out')}"
            for n in self.nodes
        )

    def stall_replication(self, leader: PatroniNode) -> list[int]:
        """SIGSTOP the leader's WAL senders: the standby stops receiving (a stalled link)."""
        pid = leader.postmaster_pid()
        senders = leader.children(pid, "walsender") if pid else []
        for sender in senders:
            os.kill(sender, signal.SIGSTOP)
        return senders

    def kill_postmaster(self, leader: PatroniNode, stalled: list[int]) -> int:
        """``kill -9`` the leader's postmaster (and the WAL senders stalled before it)."""
        pid = leader.postmaster_pid()
        if pid is None:
            raise RuntimeError(f"failover: {leader.name} has no running postmaster")
        os.kill(pid, signal.SIGKILL)
        for sender in stalled:
            with contextlib.suppress(ProcessLookupError):
                os.kill(sender, signal.SIGKILL)
        return pid

    def switchover(self, *, leader: str, candidate: str) -> str:
        """A planned switchover through Patroni's REST API; its answer."""
        body = json.dumps({"leader": leader, "candidate": candidate}).encode()
        request = urllib.request.Request(
            f"{self.node(leader).rest}/switchover", data=body, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=60.0) as answer:
                return f"{answer.status} {answer.read().decode(errors='replace').strip()}"
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"failover: switchover refused: {exc.code} {exc.read()!r}") from exc

    def stop(self) -> None:
        for node in self.nodes:
            try:
                node.stop()
            except OSError:
                continue
        self.etcd.stop()
