"""``make failover``: the Postgres primary dies under a terminal fleet; Patroni promotes
the standby; the old primary rejoins; a planned switchover follows. Run with synchronous
replication, then without it, and the two compared.

    python -m idempay_tools.failover [--duration 120] [--terminals 6] [--seed 7]
                                     [--lag 2] [--modes sync,async] [--report PATH]

Each mode runs on a cluster of its own (``idempay_tools._failover_cluster``): a private
etcd, two PostgreSQL nodes under Patroni (``synchronous_mode`` on or off,
``primary_start_timeout: 0``, ``use_pg_rewind``), a private Redis, ``idempay serve
--workers 2`` + ``completer`` + ``relay`` connected with the multi-host URL
(``host=A&host=B&target_session_attrs=read-write``), the chaos proxy in front of the API,
terminal processes (SDK + journal) and a probe (``idempay_tools._chaos_fleet``).

The run, on one timeline (fractions of ``--duration``):
1. 30 %: the replication link stalls for ``--lag`` seconds (the primary's WAL sender is
   SIGSTOPped: what a slow network or a busy standby does), then ``kill -9`` of the
   primary's postmaster. Patroni fails over; the API answers 503 (nothing processed)
   until its pool reaches the new primary; terminals retry with the same keys. Without
   synchronous replication, the standby never received the stalled commits — which the
   terminals hold as approved — and ``idempay admin new-epoch`` follows the promotion
   (docs/operations.md, failover runbook), so Redis cannot vouch for what was lost.
2. Patroni starts the old primary again as a standby (``pg_rewind`` when it diverged).
3. 65 % (or once the old primary is back): a planned switchover to it.
4. The end: terminals settle their journals, the probe's keys are settled, the completer
   and relay drain; the checks (``idempay_tools._failover_checks``) run against the
   primary of the moment. Lost acknowledged payments are looked up through the API too.

Time to recover: from the kill (or the switchover request) until a probe create was
answered 201/202 again. Exit status 0 when the ``sync`` mode's checks hold (0 lost, 0
duplicated, 0 stuck, ledger balanced, outbox relayed without gaps, no 500); the ``async``
mode's losses are the measurement, reported, not a failure.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from idempay_tools import _chaos_report
from idempay_tools._chaos_fleet import Probe, Tally, TerminalProcess
from idempay_tools._chaos_services import ROOT, Api, PrivateRedis, Sidecar, migrate_and_keys
from idempay_tools._failover_checks import check
from idempay_tools._failover_cluster import PatroniCluster
from idempay_tools._failover_report import Event, ModeResult, markdown, show
from idempay_tools.chaos_proxy import ChaosProxy
from idempay_tools.serve_process import say

MERCHANTS = ("ha-m1", "ha-m2")
PROBE = "ha-probe"
LOSS = 0.02
WAIT_S = 120.0


def _env(cluster: PatroniCluster, redis: PrivateRedis, root: Path) -> dict[str, str]:
    return {
        "IDEMPAY_DATABASE_URL": cluster.database_url,
        "IDEMPAY_REDIS_URL": redis.url,
        "IDEMPAY_REDIS_PREFIX": "ha:",
        "IDEMPAY_VAR_DIR": str(root / "var"),
        "IDEMPAY_COMPLETER_ENABLED": "false",
        "IDEMPAY_COMPLETER_INTERVAL": "0.5",
        "IDEMPAY_DB_POOL_SIZE": "6",
        "IDEMPAY_DB_TIMEOUT": "3",
        "IDEMPAY_RATE_LIMIT": "100000/second",
        "IDEMPAY_RATE_LIMIT_TERMINAL": "100000/second",
        "IDEMPAY_LOG_LEVEL": "WARNING",
    }


class Mode:
    """One mode's run: everything it started, and what it saw."""

    def __init__(self, args: argparse.Namespace, *, sync: bool) -> None:
        self.args, self.sync = args, sync
        self.root = Path(tempfile.mkdtemp(prefix=f"idempay-failover-{self.name}-"))
        self.root.chmod(0o755)  # the postgres user reaches its nodes' folders
        self.cluster = PatroniCluster(self.root, sync=sync)
        self.redis = PrivateRedis(self.root)
        self.tally = Tally()
        self.events: list[Event] = []
        self.errors: list[str] = []
        self._stop: list[object] = []

    @property
    def name(self) -> str:
        return "sync" if self.sync else "async"

    def run(self) -> ModeResult:
        try:
            return self._run()
        finally:
            for thing in reversed(self._stop):
                try:
                    thing.stop()  # type: ignore[attr-defined]
                except Exception as exc:  # keep cleaning up
                    say(f"failover: cleanup: {type(exc).__name__}: {exc}")
            self.redis.kill()
            self.cluster.stop()
            if not self.args.keep:
                shutil.rmtree(self.root, ignore_errors=True)

    def _run(self) -> ModeResult:
        args = self.args
        say(f"failover[{self.name}]: etcd + 2 Patroni nodes in {self.root}")
        self._stop.append(self.cluster)
        self.cluster.start()
        self.redis.start()
        url = self.cluster.database_url
        keys = migrate_and_keys(url, [*MERCHANTS, PROBE])
        env = _env(self.cluster, self.redis, self.root)
        logs = self.root / "logs"
        logs.mkdir()
        api = Api(env, logs / "api.log", workers=2, cwd=ROOT).start()
        self._stop.append(api)
        for name in ("completer", "relay"):
            sidecar = Sidecar([name], env, logs / f"{name}.log")
            sidecar.launch()
            self._stop.append(sidecar)
        proxy = ChaosProxy(
            target_host="127.0.0.1", target_port=api.port, seed=args.seed, loss=LOSS,
            drop_request_ratio=0.5, reset_ratio=0.2,
        ).run_in_thread()  # fmt: skip
        self._stop.append(proxy)
        terminals = self._terminals(proxy.port, keys)
        probe = Probe(api.url, keys[PROBE][1])
        started = time.monotonic()
        for terminal in terminals:
            terminal.start()
        probe.start()
        self._timeline(started, probe, env)
        (self.root / "stop").touch()
        for terminal in terminals:
            if not terminal.join(240):
                terminal.terminate()
                self.errors.append(f"{terminal.terminal_id} did not settle its journal")
            self.errors.extend(terminal.unexpected_exits)
        probe.stop()
        fleet_s = time.monotonic() - started
        probe_outcome = probe.settle()
        ids = [keys[name][0] for name in MERCHANTS]
        drained = asyncio.run(_chaos_report.drain(url, [*ids, keys[PROBE][0]]))
        checks = asyncio.run(
            check(url, merchants=ids, probe=keys[PROBE][0], reported=dict(self.tally.outcomes),
                  journals=[t.journal for t in terminals])
        )  # fmt: skip
        lost = [v.key for v in checks.fleet.violations if v.key and v.detail.endswith("held []")]
        lookups = self._look_up(api.url, lost, {t.terminal_id: t.config.api_key for t in terminals})
        return ModeResult(
            mode=self.name, fleet_s=fleet_s, terminals=len(terminals), lag_s=args.lag,
            events=self.events, outcomes=dict(sorted(_count(self.tally.outcomes).items())),
            probe=(len(probe.results), sum(1 for _, ok in probe.results if not ok)),
            probe_outcome=probe_outcome, drained=drained, checks=checks,
            lost_lookups=lookups, errors=self.errors, members=self.cluster.members(),
        )  # fmt: skip

    def _terminals(self, port: int, keys: dict[str, tuple[str, str]]) -> list[TerminalProcess]:
        from idempay_tools.simulate import FleetConfig

        made = []
        for index in range(self.args.terminals):
            config = FleetConfig(
                base_url=f"http://127.0.0.1:{port}",
                api_key=keys[MERCHANTS[index % len(MERCHANTS)]][1],
                workdir=self.root / "journals", via_proxy=True, seed=self.args.seed,
                deadline_s=60.0, timeout_s=5.0, max_backoff=1.0, abort_grace_s=30.0,
                terminal_prefix=f"HA{self.name[0].upper()}",
            )  # fmt: skip
            config.workdir.mkdir(parents=True, exist_ok=True)
            made.append(TerminalProcess(config, index, self.root / "stop", self.tally))
        return made

    def _timeline(self, started: float, probe: Probe, env: dict[str, str]) -> None:
        duration = self.args.duration
        _sleep_until(started + duration * 0.3)
        self._failover(probe, env)
        _sleep_until(started + duration * 0.65)
        self._switchover(probe)
        _sleep_until(started + duration)

    def _failover(self, probe: Probe, env: dict[str, str]) -> None:
        cluster = self.cluster
        leader = cluster.leader()
        if leader is None:
            raise RuntimeError("failover: no leader before the kill")
        old = cluster.node(str(leader["name"]))
        new = next(n for n in cluster.nodes if n is not old)
        stalled = cluster.stall_replication(old)
        time.sleep(self.args.lag)
        pid = cluster.kill_postmaster(old, stalled)
        killed = time.monotonic()
        event = Event("failover", f"WAL sender of {old.name} stopped {self.args.lag:g} s "
                      f"({len(stalled)} stopped), then kill -9 of its postmaster (pid {pid})",
                      killed, old=old.name, new=new.name)  # fmt: skip
        self.events.append(event)
        event.promoted = cluster.wait(
            lambda m: cluster._role(m, new.name) == "leader", WAIT_S, f"{new.name} promoted"
        )
        if not self.sync:
            event.detail += "; `idempay admin new-epoch` after the promotion"
            self._new_epoch(env)
        event.recovered = _first_success(probe, event.promoted)
        standby = "sync_standby" if self.sync else "replica"
        event.rejoined = cluster.wait(
            lambda m: cluster._streaming(m, old.name, standby), WAIT_S, f"{old.name} rejoined"
        )
        event.rewound = "pg_rewind" in (old.root / "patroni.log").read_text(errors="replace")

    def _switchover(self, probe: Probe) -> None:
        cluster = self.cluster
        leader = cluster.leader()
        if leader is None:
            raise RuntimeError("failover: no leader before the switchover")
        candidate = next(n.name for n in cluster.nodes if n.name != leader["name"])
        asked = time.monotonic()
        answer = cluster.switchover(leader=str(leader["name"]), candidate=candidate)
        event = Event("switchover", f"POST /switchover → {answer}", asked,
                      old=str(leader["name"]), new=candidate)  # fmt: skip
        self.events.append(event)
        event.promoted = cluster.wait(
            lambda m: cluster._role(m, candidate) == "leader", WAIT_S, f"{candidate} leads"
        )
        event.recovered = _first_success(probe, event.promoted)
        standby = "sync_standby" if self.sync else "replica"
        event.rejoined = cluster.wait(
            lambda m: cluster._streaming(m, event.old, standby), WAIT_S, f"{event.old} follows"
        )

    def _new_epoch(self, env: dict[str, str]) -> None:
        done = subprocess.run(
            [sys.executable, "-m", "api", "admin", "new-epoch"], cwd=ROOT,
            env={**os.environ, **env}, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        if done.returncode != 0:
            self.errors.append(f"idempay admin new-epoch failed: {done.stderr[-300:]}")

    def _look_up(self, base_url: str, lost: list[str], api_keys: dict[str, str]) -> dict[int, int]:
        """GET each lost payment through the API: status → count. 404 is the truth; a 200
        would be Redis vouching for a payment the database no longer holds."""
        statuses: dict[int, int] = {}
        with httpx.Client(base_url=base_url, timeout=5.0) as http:
            for key in lost:
                api_key = api_keys.get(self.tally.terminal_of.get(key, ""))
                if api_key is None:
                    continue
                try:
                    answer = http.get(
                        f"/v1/transactions/{key}", headers={"Authorization": f"Bearer {api_key}"}
                    )
                except httpx.HTTPError:
                    continue
                statuses[answer.status_code] = statuses.get(answer.status_code, 0) + 1
        return statuses


def _count(outcomes: dict[str, str]) -> dict[str, int]:
    counted: dict[str, int] = {}
    for status in outcomes.values():
        counted[status] = counted.get(status, 0) + 1
    return counted


def _sleep_until(moment: float) -> None:
    if (left := moment - time.monotonic()) > 0:
        time.sleep(left)


def _first_success(probe: Probe, after: float, timeout: float = WAIT_S) -> float | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (ok := probe.first_success_after(after)) is not None:
            return ok
        time.sleep(0.1)
    return None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m idempay_tools.failover", description=__doc__)
    parser.add_argument("--duration", type=float, default=120.0, help="fleet seconds per mode")
    parser.add_argument("--terminals", type=int, default=6)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--lag", type=float, default=2.0, help="replication stall before kill")
    parser.add_argument("--modes", default="sync,async", help="sync, async or both")
    parser.add_argument("--report", type=Path, help="write the runs as Markdown here")
    parser.add_argument("--keep", action="store_true", help="keep the runs' folders")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or set(modes) - {"sync", "async"}:
        raise SystemExit("failover: --modes takes sync, async or sync,async")
    if args.duration < 40:
        raise SystemExit("failover: --duration must be at least 40 s")
    results = []
    for mode in modes:
        result = Mode(args, sync=mode == "sync").run()
        show(result)
        results.append(result)
    command = " ".join(["python -m idempay_tools.failover", *(argv or sys.argv[1:])])
    if args.report:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(markdown(results, command))
        say(f"failover: report written to {args.report}")
    ok = all(r.ok for r in results if r.mode == "sync") and all(not r.errors for r in results)
    say("failover: " + ("PASSED" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
