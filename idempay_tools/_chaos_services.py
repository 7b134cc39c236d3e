"""The chaos harness's own services, so that restarting them never touches anything shared.

- ``PrivatePostgres``: a throw-away PostgreSQL cluster (``initdb`` in a temporary folder,
  its own port and socket folder, run as the ``postgres`` user when we are root), which
  the harness crashes (``pg_ctl stop -m immediate``: no checkpoint, crash recovery on the
  next start) and starts again;
- ``PrivateRedis``: a ``redis-server`` on its own port that keeps nothing on disk, which
  the harness SIGKILLs and starts again (empty, like a Redis that lost its memory);
- ``Api``: ``python -m api serve --workers N`` (``idempay_tools.serve_process``); ``kill_worker()``
  SIGKILLs one uvicorn worker process, and uvicorn's supervisor starts a new one;
- ``Sidecar``: ``python -m api completer`` / ``python -m api relay`` as their own processes.

Only loopback addresses are used.
"""

from __future__ import annotations

import asyncio
import glob
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from idempay_tools.serve_process import ServerProcess, free_port

ROOT = Path(__file__).resolve().parents[1]
LOCAL = "127.0.0.1"

__all__ = ["Api", "PrivatePostgres", "PrivateRedis", "Sidecar", "free_port", "pg_bin"]


def pg_bin() -> Path:
    """The newest PostgreSQL server binaries on the machine (Debian's layout, else PATH)."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0,
    )
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    if initdb is None:
        raise RuntimeError("chaos: PostgreSQL server binaries (initdb, pg_ctl) not found")
    return Path(initdb).parent


def _tail(path: Path, size: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-size:]
    except OSError:
        return ""


class PrivatePostgres:
    """A PostgreSQL cluster of the harness's own under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root / "pg"
        self.data = self.root / "data"
        self.log = self.root / "postgres.log"
        self.port = free_port()
        self._bin = pg_bin()
        self._as_postgres = os.geteuid() == 0  # the server refuses to run as root

    @property
    def url(self) -> str:
        return f"postgresql+asyncpg://postgres@{LOCAL}:{self.port}/postgres"

    def _run(self, *args: str, timeout: float = 120.0) -> None:
        command = [str(self._bin / args[0]), *args[1:]]
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(
                f"chaos: {' '.join(args[:2])} failed ({done.returncode}):\n"
                f"{done.stdout}{done.stderr}{_tail(self.log)}"
            )

    def init(self) -> PrivatePostgres:
        self.root.mkdir(parents=True)
        if self._as_postgres:
            shutil.chown(self.root, "postgres", "postgres")
            for parent in self.root.parents:  # let the postgres user reach its folder
                if parent == Path("/") or parent.stat().st_uid != 0:
                    break
                parent.chmod(parent.stat().st_mode | 0o711)
        self._run(
            "initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8",
            "--no-instructions", "--no-sync",
        )  # fmt: skip
        return self

    def start(self) -> None:
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses={LOCAL} "
            "-c max_connections=80 -c shared_buffers=64MB"
        )
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w",
                  "-t", "60", "start")  # fmt: skip

    def crash(self) -> None:
        """Stop at once, as a crash would: no shutdown checkpoint, recovery on restart."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def dump(self, name: str) -> Path:
        """``pg_dump -Fc`` of the database the API uses (a consistent snapshot); its file."""
        path = self.root / f"{name}.pgdump"
        self._run("pg_dump", "-h", LOCAL, "-p", str(self.port), "-U", "postgres", "-Fc",
                  "-f", str(path), "postgres")  # fmt: skip
        return path

    def restore(self, path: Path) -> None:
        """Put the database back as ``path`` had it (``pg_restore --clean``, one transaction);
        nothing else may be connected (stop the API and its sidecars first)."""
        self._run("pg_restore", "-h", LOCAL, "-p", str(self.port), "-U", "postgres",
                  "--clean", "--if-exists", "--single-transaction", "-d", "postgres",
                  str(path))  # fmt: skip

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            try:
                self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "-t", "30", "stop")
            except RuntimeError:
                self.crash()


class PrivateRedis:
    """A ``redis-server`` of the harness's own, nothing on disk."""

    def __init__(self, root: Path) -> None:
        self.root = root / "redis"
        self.port = free_port()
        self.log = self.root / "redis.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{LOCAL}:{self.port}/0"

    def start(self, *, timeout: float = 20.0) -> None:
        server = shutil.which("redis-server")
        if server is None:
            raise RuntimeError("chaos: redis-server not found")
        self.root.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [server, "--port", str(self.port), "--bind", LOCAL, "--save", "",
             "--appendonly", "no", "--dir", str(self.root), "--logfile", str(self.log)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._ping():
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"chaos: redis-server did not start:\n{_tail(self.log)}")

    def _ping(self) -> bool:
        try:
            with socket.create_connection((LOCAL, self.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    stop = kill


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
