"""The chaos harness's own processes, so that restarting them never touches anything shared.

- ``PrivatePostgres`` / ``PrivateRedis`` (from ``idempay_tools.private_services``, the one
  launcher): the cluster the harness crashes, dumps and restores; the Redis it SIGKILLs
  and starts again empty;
- ``Api``: ``python -m api serve --workers N`` (``idempay_tools.serve_process``); ``kill_worker()``
  SIGKILLs one uvicorn worker process, and uvicorn's supervisor starts a new one;
- ``Sidecar``: ``python -m api completer`` / ``python -m api relay`` as their own processes;
- ``Tracker``: what every one of them shares — the run's PID registry
  (``idempay_tools._chaos_reaper``: each process is registered as it starts, so that cleanup,
  or the reaper if the harness dies, stops it by PID), the time the current phase has left
  (``idempay_tools._chaos_budget``: every command and wait is capped by it), and ``closing``
  (set when the run stops: nothing is started any more).

Only loopback addresses are used.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from idempay_tools._chaos_reaper import Registry, postmaster_pid, start_time
from idempay_tools.private_services import PrivatePostgres, PrivateRedis, free_port, pg_bin
from idempay_tools.serve_process import ServerProcess

ROOT = Path(__file__).resolve().parents[1]

__all__ = [
    "Api",
    "ChaosPostgres",
    "ChaosRedis",
    "Closing",
    "PrivatePostgres",
    "PrivateRedis",
    "Sidecar",
    "Tracker",
    "free_port",
    "pg_bin",
]


class Closing(RuntimeError):
    """The run is stopping: nothing new is started."""


class Tracker:
    """The run's PID registry, its current phase's time left, and whether it is closing."""

    def __init__(self, root: Path, left: Callable[[float], float] | None = None) -> None:
        self.registry = Registry(root)
        self.closing = threading.Event()
        self._left = left

    def left(self, cap: float = math.inf) -> float:
        """Seconds a command or wait may take now: ``cap``, or less near the deadline."""
        return cap if self._left is None else self._left(cap)

    def check(self, what: str) -> None:
        if self.closing.is_set():
            raise Closing(f"{what}: the run is stopping")

    def timeout(self, what: str, cap: float) -> float:
        """``left(cap)`` for a command about to start; ``Closing`` / ``TimeoutError`` when
        there is no time left for it."""
        self.check(what)
        left = self.left(cap)
        if left <= 0:
            raise TimeoutError(f"{what}: no time left in this phase")
        return left


class _Tracked(ServerProcess):
    """A server process registered (by its process group) as soon as it is launched."""

    tracker: Tracker | None = None
    label = "server"

    def launch(self) -> None:
        if self.tracker is not None:
            self.tracker.check(f"start {self.label}")
        super().launch()
        if self.tracker is not None and self.proc is not None:
            self.tracker.registry.add(self.proc.pid, self.label, group=True)

    def start(self, *, timeout: float = 60.0) -> _Tracked:
        if self.tracker is not None:
            timeout = self.tracker.timeout(f"start {self.label}", timeout)
        super().start(timeout=timeout)
        return self


class Api(_Tracked):
    """``idempay serve --workers N`` whose workers can be killed one at a time."""

    label = "api"

    def start(self, *, timeout: float = 90.0) -> Api:
        if self.tracker is not None:
            timeout = self.tracker.timeout("start the API", timeout)
        deadline = time.monotonic() + timeout
        super().start(timeout=timeout)
        while len(self.worker_pids()) < self.workers:  # ready once every worker is up
            if time.monotonic() > deadline:
                raise TimeoutError(f"chaos: the API workers did not start:\n{self.log_tail()}")
            time.sleep(0.1)
        return self

    def worker_pids(self) -> list[int]:
        """uvicorn's worker processes: the supervisor's children that run ``spawn_main``
        (not multiprocessing's resource tracker)."""
        if self.proc is None:
            return []
        try:
            children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
        except OSError:
            return []
        pids = []
        for pid in map(int, children.split()):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            if b"spawn_main" in cmdline and b"resource_tracker" not in cmdline:
                pids.append(pid)
        return pids

    def terminate_worker(self, pid: int) -> None:
        """SIGTERM one worker: it drains and shuts down; the supervisor starts a new one."""
        os.kill(pid, signal.SIGTERM)

    def kill_worker(self, rng: random.Random) -> int:
        pids = self.worker_pids()
        if not pids:
            raise RuntimeError("chaos: the API has no worker to kill")
        victim = rng.choice(sorted(pids))
        os.kill(victim, signal.SIGKILL)
        return victim

    def wait_workers(self, *, without: int, timeout: float = 60.0) -> bool:
        """Until ``workers`` workers run again and none of them is ``without``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pids = self.worker_pids()
            if without not in pids and len(pids) >= self.workers:
                return True
            time.sleep(0.1)
        return False


class Sidecar(_Tracked):
    """``idempay completer`` or ``idempay relay``: ``args`` are the CLI's; no port, no
    readiness check (``launch`` only)."""

    def __init__(
        self, args: list[str], env: Mapping[str, str], log: Path, tracker: Tracker | None = None
    ) -> None:
        super().__init__(env, log, args=args, cwd=ROOT)
        self.tracker = tracker
        self.label = args[0]

    def command(self) -> list[str]:
        return [sys.executable, "-m", "api", *self.args]


class ChaosPostgres(PrivatePostgres):
    """The private cluster, every ``pg_ctl`` / ``pg_dump`` / ``pg_restore`` capped by the
    phase's time left and refused once the run is closing (except stopping it)."""

    def __init__(self, root: Path, tracker: Tracker) -> None:
        super().__init__(root)
        self.tracker = tracker

    def _run(self, *args: str, timeout: float = 120.0) -> None:
        what = " ".join(args[:1] + tuple(a for a in args[1:] if a in ("start", "stop")))
        timeout = self.tracker.timeout(what, timeout)
        try:
            super()._run(*args, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise TimeoutError(f"{what} did not finish within {timeout:.0f} s") from exc
        if "start" in args and (pid := postmaster_pid(self.root.parent)) is not None:
            self.tracker.registry.add(pid, "postgres")

    def stop_now(self, *, timeout: float = 20.0) -> None:
        """Cleanup: an immediate shutdown (the cluster is thrown away), then SIGKILL of
        the postmaster if it is still there."""
        pid = postmaster_pid(self.root.parent)
        if pid is None:
            return
        with contextlib.suppress(RuntimeError, TimeoutError, OSError):
            super()._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "-t",
                         str(int(timeout)), "stop", timeout=timeout + 5)  # fmt: skip
        if start_time(pid) is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


class ChaosRedis(PrivateRedis):
    """The private Redis, registered by PID each time it starts."""

    def __init__(self, root: Path, tracker: Tracker) -> None:
        super().__init__(root)
        self.tracker = tracker

    def start(self, *, timeout: float = 20.0) -> ChaosRedis:
        timeout = self.tracker.timeout("start redis-server", timeout)
        try:
            super().start(timeout=timeout)
        finally:
            if self.proc is not None:
                self.tracker.registry.add(self.proc.pid, "redis-server", group=True)
        return self


def migrate_and_keys(database_url: str, merchants: list[str]) -> dict[str, tuple[str, str]]:
    """Apply the migrations; one new API key per merchant: name → (merchant_id, key)."""
    from api.auth import create_api_key
    from api.config import Settings
    from api.db import create_engine
    from api.migrate import migrate
    from idempay_tools.invariants import merchant_for_api_key

    settings = Settings(database_url=database_url)
    migrate(settings)

    async def keys() -> dict[str, tuple[str, str]]:
        engine = create_engine(settings)
        made = {}
        try:
            for name in merchants:
                key = await create_api_key(engine, name)
                merchant_id = await merchant_for_api_key(engine, key)
                if merchant_id is None:
                    raise RuntimeError(f"chaos: the new key of {name} has no merchant")
                made[name] = (merchant_id, key)
            return made
        finally:
            await engine.dispose()

    return asyncio.run(keys())
