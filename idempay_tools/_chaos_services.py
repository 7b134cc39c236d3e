"""The chaos harness's own processes, so that restarting them never touches anything shared.

- ``PrivatePostgres`` / ``PrivateRedis`` (from ``idempay_tools.private_services``, the one
  launcher): the cluster the harness crashes, dumps and restores; the Redis it SIGKILLs
  and starts again empty;
- ``Api``: ``python -m api serve --workers N`` (``idempay_tools.serve_process``); ``kill_worker()``
  SIGKILLs one uvicorn worker process, and uvicorn's supervisor starts a new one;
- ``Sidecar``: ``python -m api completer`` / ``python -m api relay`` as their own processes.

Only loopback addresses are used.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from idempay_tools.private_services import PrivatePostgres, PrivateRedis, free_port, pg_bin
from idempay_tools.serve_process import ServerProcess

ROOT = Path(__file__).resolve().parents[1]

__all__ = ["Api", "PrivatePostgres", "PrivateRedis", "Sidecar", "free_port", "pg_bin"]


class Api(ServerProcess):
    """``idempay serve --workers N`` whose workers can be killed one at a time."""

    def start(self, *, timeout: float = 90.0) -> Api:
        super().start(timeout=timeout)
        deadline = time.monotonic() + timeout
        while len(self.worker_pids()) < self.workers:  # ready once every worker is up
            if time.monotonic() > deadline:
                raise RuntimeError(f"chaos: the API workers did not start:\n{self.log_tail()}")
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


class Sidecar(ServerProcess):
    """``idempay completer`` or ``idempay relay``: ``args`` are the CLI's; no port, no
    readiness check (``launch`` only)."""

    def __init__(self, args: list[str], env: Mapping[str, str], log: Path) -> None:
        super().__init__(env, log, args=args, cwd=ROOT)

    def command(self) -> list[str]:
        return [sys.executable, "-m", "api", *self.args]


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
