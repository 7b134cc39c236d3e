"""Private services — the one launcher for everything that needs a PostgreSQL or Redis of
its own or a database of its own on the machine's shared PostgreSQL (issue 15): the tests'
fixtures, the bench, ``make chaos`` and ``make failover`` all start them from here.

- ``create_database`` / ``drop_database`` / ``pg_url``: a throw-away database on the shared
  PostgreSQL (``IDEMPAY_TEST_PG``, default ``postgres@127.0.0.1:5432``), dropped ``WITH
  (FORCE)``;
- ``PrivatePostgres``: a throw-away PostgreSQL cluster (``initdb`` in a folder of the
  caller's, its own port and socket folder, run as the ``postgres`` user when we are
  root), which can be crashed (``pg_ctl stop -m immediate``: no checkpoint, crash recovery
  on the next start), dumped, restored and started again;
- ``PrivateRedis``: a ``redis-server`` on its own port that keeps nothing on disk, which
  can be SIGKILLed and started again (empty, like a Redis that lost its memory).

Only loopback addresses are used; every process is stopped by the caller, by PID.
"""

from __future__ import annotations

import asyncio
import glob
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path

import asyncpg

from idempay_tools.serve_process import free_port

LOCAL = "127.0.0.1"
PG_ADMIN = os.environ.get("IDEMPAY_TEST_PG", f"postgresql://postgres@{LOCAL}:5432/postgres")

__all__ = [
    "PG_ADMIN",
    "PrivatePostgres",
    "PrivateRedis",
    "admin_sql",
    "create_database",
    "drop_database",
    "free_port",
    "pg_bin",
    "pg_url",
]


def pg_url(database: str, *, driver: str = "postgresql+asyncpg") -> str:
    """The URL of ``database`` on the shared PostgreSQL."""
    base = PG_ADMIN.rsplit("/", 1)[0].split("://", 1)[1]
    return f"{driver}://{base}/{database}"


async def _admin(sql: str) -> None:
    conn = await asyncpg.connect(PG_ADMIN)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


def admin_sql(sql: str) -> None:
    """One statement on the shared PostgreSQL's ``postgres`` database, as its superuser."""
    asyncio.run(_admin(sql))


def create_database(prefix: str = "idempay_t") -> str:
    """A new empty database on the shared PostgreSQL, named ``<prefix>_<pid>_<hex>``."""
    name = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    asyncio.run(_admin(f'CREATE DATABASE "{name}"'))
    return name


def drop_database(name: str) -> None:
    asyncio.run(_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


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
        raise RuntimeError("PostgreSQL server binaries (initdb, pg_ctl) not found")
    return Path(initdb).parent


def _tail(path: Path, size: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-size:]
    except OSError:
        return ""


class PrivatePostgres:
    """A PostgreSQL cluster of the caller's own under ``root / "pg"``."""

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
                f"{' '.join(args[:2])} failed ({done.returncode}):\n"
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
    """A ``redis-server`` of the caller's own under ``root / "redis"``, nothing on disk."""

    def __init__(self, root: Path) -> None:
        self.root = root / "redis"
        self.port = free_port()
        self.log = self.root / "redis.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{LOCAL}:{self.port}/0"

    def start(self, *, timeout: float = 20.0) -> PrivateRedis:
        server = shutil.which("redis-server")
        if server is None:
            raise RuntimeError("redis-server not found")
        self.root.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + timeout
        # The port was free when chosen; another process (a parallel test's own Redis) may
        # have taken it since. Then our server exits, and a ping would be answered by theirs:
        # only an answer naming our process id counts, and a lost port is chosen again.
        for _attempt in range(5):
            self.proc = subprocess.Popen(
                [server, "--port", str(self.port), "--bind", LOCAL, "--save", "",
                 "--appendonly", "no", "--dir", str(self.root), "--logfile", str(self.log)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
            while time.monotonic() < deadline:
                if self._answering_pid() == self.proc.pid:
                    return self
                if self.proc.poll() is not None:
                    break
                time.sleep(0.05)
            if self.proc.poll() is None:  # alive but never ours to answer: out of time
                break
            self.port = free_port()
        raise RuntimeError(f"redis-server did not start:\n{_tail(self.log)}")

    def _answering_pid(self) -> int | None:
        """The process id of the Redis answering on our port (``INFO server``), if any."""
        try:
            with socket.create_connection((LOCAL, self.port), timeout=0.5) as sock:
                sock.sendall(b"INFO server\r\n")
                reply = b""
                while b"process_id:" not in reply or not reply.endswith(b"\r\n"):
                    chunk = sock.recv(4096)
                    if not chunk:
                        break
                    reply += chunk
        except OSError:
            return None
        for line in reply.split(b"\r\n"):
            if line.startswith(b"process_id:"):
                return int(line.split(b":", 1)[1])
        return None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    stop = kill
