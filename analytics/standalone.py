"""A Spark standalone cluster on this machine, from the pyspark package's own launch
classes: a master and N workers on 127.0.0.1, private ports, stopped by PID.

    python -m analytics.standalone --workers 2 --workdir var/spark-cluster -- \\
        --from 2026-11-14 --to 2026-11-20 --lake lake --out out

starts the cluster, runs the daily audit on it — the CronJob's command line,
``spark-submit analytics/jobs/daily_audit.py …``, with ``--master spark://127.0.0.1:PORT``
— and stops the cluster however the audit ends (its exit status is the command's).
``StandaloneCluster`` does the same as a context manager for tests and drills;
``kill_worker`` SIGKILLs a worker and the executors it launched (a machine lost mid-job).

Each daemon is ``pyspark/bin/spark-class org.apache.spark.deploy.master.Master`` (or
``….worker.Worker``), which execs the JVM, started in a process group of its own so that
stopping it (SIGTERM, then SIGKILL after ``STOP_GRACE_S``) also ends its executors. Ports
are drawn from [20000, 32768) — below Linux's ephemeral range, so nothing the kernel hands
out meanwhile takes them — and checked free on 127.0.0.1 first. ``SPARK_LOCAL_IP`` binds
the RPC endpoints and the web UIs to 127.0.0.1. Logs go to ``WORKDIR/logs``, executors'
work directories to ``WORKDIR/worker-N``; ``WORKDIR/conf/spark-defaults.conf`` holds the
driver's settings for this cluster (``SPARK_CONF_DIR``), so ``submit`` is spark-submit
with nothing but the master added.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pyspark

HOST = "127.0.0.1"
PORTS = range(20_000, 32_768)
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
STOP_GRACE_S = 10.0
AUDIT_JOB = Path(__file__).resolve().parent / "jobs" / "daily_audit.py"


def spark_home() -> Path:
    """The pyspark package is a Spark distribution: bin/spark-class, jars/."""
    return Path(pyspark.__file__).resolve().parent


def free_port(taken: set[int]) -> int:
    """A port of ``PORTS`` that nothing listens on (127.0.0.1) and not in ``taken``."""
    for port in random.sample(PORTS, 200):
        if port in taken:
            continue
        with socket.socket() as probe:
            try:
                probe.bind((HOST, port))
            except OSError:
                continue
        taken.add(port)
        return port
    raise RuntimeError(f"no free port in {PORTS}")


def get_json(port: int, path: str) -> Any:
    """A daemon's (or the driver's) web UI answer, e.g. the master's ``/json/``."""
    with urllib.request.urlopen(f"http://{HOST}:{port}{path}", timeout=5) as answer:
        return json.load(answer)


@dataclass
class Daemon:
    """One JVM we started: its process (the group leader) and log."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path
    rpc_port: int
    ui_port: int

    def alive(self) -> bool:
        return self.process.poll() is None

    def signal_group(self, signum: int) -> None:
        """``signum`` to the daemon and every process it started (its executors)."""
        with suppress(ProcessLookupError):  # the whole group has exited already
            os.killpg(self.process.pid, signum)

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        self.signal_group(signal.SIGTERM)
        with suppress(subprocess.TimeoutExpired):
            self.process.wait(grace_s)
        self.signal_group(signal.SIGKILL)  # stragglers of the group (an executor) too
        self.process.wait()

    def tail(self, lines: int = 30) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


@dataclass
class StandaloneCluster:
    """A master and ``workers`` workers (``cores`` cores, ``memory`` each) on 127.0.0.1."""

    workdir: Path
    workers: int = 2
    cores: int = 1
    memory: str = "1g"
    executor_memory: str = "512m"
    daemon_java_opts: str = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1"
    master: Daemon | None = None
    worker_daemons: list[Daemon] = field(default_factory=list)
    taken: set[int] = field(default_factory=set)

    @property
    def url(self) -> str:
        assert self.master is not None, "the cluster is not started"
        return f"spark://{HOST}:{self.master.rpc_port}"

    @property
    def conf_dir(self) -> Path:
        return self.workdir / "conf"

    def env(self) -> dict[str, str]:
        """What the daemons and spark-submit run with."""
        return {
            **os.environ,
            "SPARK_HOME": str(spark_home()),
            "SPARK_LOCAL_IP": HOST,
            "SPARK_CONF_DIR": str(self.conf_dir),
            "SPARK_LOG_DIR": str(self.workdir / "logs"),
            "SPARK_DAEMON_MEMORY": "512m",
            "SPARK_DAEMON_JAVA_OPTS": self.daemon_java_opts,
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
        }

    def driver_conf(self) -> dict[str, str]:
        """The driver's settings for this cluster: loopback, private ports, one executor
        per worker, and no task before every executor has registered (the same cluster
        for every run)."""
        return {
            "spark.driver.host": HOST,
            "spark.driver.bindAddress": HOST,
            "spark.driver.port": str(free_port(self.taken)),
            "spark.driver.blockManager.port": str(free_port(self.taken)),
            "spark.cores.max": str(self.workers * self.cores),
            "spark.executor.cores": str(self.cores),
            "spark.executor.memory": self.executor_memory,
            "spark.scheduler.minRegisteredResourcesRatio": "1.0",
            "spark.scheduler.maxRegisteredResourcesWaitingTime": "120s",
            "spark.ui.enabled": "false",
        }

    # ------------------------------------------------------------------ lifecycle
    def start(self, *, timeout_s: float = 180.0) -> StandaloneCluster:
        """Start the master and the workers; return once every worker is ALIVE on the
        master. Whatever was started is stopped again if that fails."""
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
        self.conf_dir.mkdir(parents=True, exist_ok=True)
        try:
            self.master = self._launch("master", MASTER_CLASS, [])
            self._write_defaults()
            for index in range(self.workers):
                work = self.workdir / f"worker-{index}"
                work.mkdir(exist_ok=True)
                options = ["--cores", str(self.cores), "--memory", self.memory]
                options += ["--work-dir", str(work), self.url]
                self.worker_daemons.append(self._launch(f"worker-{index}", WORKER_CLASS, options))
            self._wait_for_workers(self.workers, timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the workers (and their executors), then the master; each by its PID."""
        for daemon in [*self.worker_daemons, *([self.master] if self.master else [])]:
            daemon.stop()

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def kill_worker(self, index: int) -> None:
        """SIGKILL worker ``index`` and its executors, as if its machine were lost."""
        daemon = self.worker_daemons[index]
        daemon.signal_group(signal.SIGKILL)
        daemon.process.wait()

    # ------------------------------------------------------------------- queries
    def state(self) -> dict[str, Any]:
        """The master's ``/json/``: workers, alive workers, apps."""
        assert self.master is not None
        return dict(get_json(self.master.ui_port, "/json/"))

    def executors_on(self, index: int) -> list[dict[str, Any]]:
        """The executors worker ``index`` runs (its ``/json/``)."""
        return list(get_json(self.worker_daemons[index].ui_port, "/json/")["executors"])

    # ------------------------------------------------------------------ submitting
    def submit(
        self,
        script: Path,
        args: Sequence[str],
        *,
        conf: Mapping[str, str] | None = None,
        log: IO[str] | None = None,
    ) -> subprocess.Popen[str]:
        """``spark-submit --master URL [--conf k=v …] script args`` (client mode: the
        driver is this machine's process); output to ``log`` (default: inherited)."""
        argv = [str(spark_home() / "bin" / "spark-submit"), "--master", self.url]
        for name, value in (conf or {}).items():
            argv += ["--conf", f"{name}={value}"]
        argv += [str(script), *args]
        return subprocess.Popen(
            argv,
            env=self.env(),
            stdout=log,
            stderr=subprocess.STDOUT if log else None,
            text=True,
            start_new_session=True,
        )

    # ------------------------------------------------------------------- internals
    def _launch(self, name: str, main_class: str, options: list[str]) -> Daemon:
        rpc, ui = free_port(self.taken), free_port(self.taken)
        argv = [str(spark_home() / "bin" / "spark-class"), main_class, "--host", HOST]
        argv += ["--port", str(rpc), "--webui-port", str(ui), *options]
        log = self.workdir / "logs" / f"{name}.log"
        with log.open("ab") as sink:
            process = subprocess.Popen(
                argv,
                env=self.env(),
                stdout=sink,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        return Daemon(name, process, log, rpc, ui)

    def _write_defaults(self) -> None:
        lines = [f"{name} {value}" for name, value in self.driver_conf().items()]
        (self.conf_dir / "spark-defaults.conf").write_text("\n".join(lines) + "\n")

    def _wait_for_workers(self, count: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            for daemon in [*([self.master] if self.master else []), *self.worker_daemons]:
                if not daemon.alive():
                    raise RuntimeError(f"{daemon.name} exited:\n{daemon.tail()}")
            try:
                if self.state().get("aliveworkers", 0) >= count:
                    return
            except OSError:
                pass  # the master's web UI is not up yet
            if time.monotonic() > deadline:
                assert self.master is not None
                raise TimeoutError(
                    f"{count} workers not alive on {self.url} after {timeout_s:.0f} s:\n"
                    f"{self.master.tail()}"
                )
            time.sleep(0.5)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m analytics.standalone",
        description="The daily audit on a throw-away Spark standalone cluster (127.0.0.1).",
        epilog="Arguments after -- go to analytics/jobs/daily_audit.py.",
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cores", type=int, default=1, help="cores per worker")
    parser.add_argument("--memory", default="1g", help="memory per worker")
    parser.add_argument("--executor-memory", default="512m")
    parser.add_argument("--workdir", type=Path, default=Path("var/spark-cluster"))
    parser.add_argument("audit_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    audit_args = args.audit_args[1:] if args.audit_args[:1] == ["--"] else args.audit_args
    cluster = StandaloneCluster(
        args.workdir,
        workers=args.workers,
        cores=args.cores,
        memory=args.memory,
        executor_memory=args.executor_memory,
    )
    with cluster:
        sys.stdout.write(f"cluster {cluster.url}: {args.workers} workers, logs in {args.workdir}\n")
        sys.stdout.flush()
        driver = cluster.submit(AUDIT_JOB, audit_args)
        try:
            return driver.wait()
        finally:
            if driver.poll() is None:  # interrupted: the driver goes with its cluster
                os.killpg(driver.pid, signal.SIGTERM)
                driver.wait()


if __name__ == "__main__":
    sys.exit(main())
