"""The bench's environment: a private Postgres database (created and dropped by
``idempay_tools.private_services``, the one launcher), one idempay server, CPU accounting.

CPU is read from ``/proc`` (Linux): the server's process group; the ``postgres`` processes
that work for the bench database (its backends, the postmaster's reaped-children time so
exited backends still count, the shared WAL writer and checkpointer — not other databases'
backends); and the machine's busy time from ``/proc/stat``. Postgres is shared with
whatever else runs here, so backends of other databases that exit during a round, and the
auxiliaries' work for them, still land in the Postgres figure: an upper bound.
"""

from __future__ import annotations

import asyncio
import os
import platform
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import httpx

from idempay_tools import private_services
from idempay_tools.private_services import PG_ADMIN, drop_database, pg_url
from idempay_tools.serve_process import ServerProcess

__all__ = [
    "PG_ADMIN",
    "CpuSample",
    "Server",
    "analyze",
    "cpu_delta",
    "create_database",
    "database_url",
    "drop_database",
    "free_connection_slots",
    "machine_info",
    "postgres_settings",
    "prepare_database",
    "prepare_url",
    "sample_cpu",
    "say",
]

ROOT = Path(__file__).resolve().parents[1]
_TICK = os.sysconf("SC_CLK_TCK")
ANALYZE_ATTEMPTS = 5


def say(text: str) -> None:
    """A line on stdout, flushed (the harnesses' progress is read live)."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def database_url(name: str) -> str:
    """The bench database's URL on the shared PostgreSQL (``private_services.pg_url``)."""
    return pg_url(name)


def create_database() -> str:
    """A new database for the bench on the shared PostgreSQL, through the one launcher
    (``idempay_tools.private_services``), dropped with ``drop_database``."""
    return private_services.create_database("idempay_bench")


def prepare_database(name: str) -> str:
    """Apply the migrations to the private Postgres database ``name``; a new API key."""
    return prepare_url(database_url(name))


def prepare_url(url: str) -> str:
    """Apply the migrations to the database at ``url`` and return a new API key for the
    merchant ``bench``."""
    from api.auth import create_api_key
    from api.config import Settings
    from api.db import create_engine
    from api.migrate import migrate

    settings = Settings(database_url=url)
    migrate(settings)

    async def make_key() -> str:
        engine = create_engine(settings)
        try:
            return await create_api_key(engine, "bench")
        finally:
            await engine.dispose()

    return asyncio.run(make_key())


class Server(ServerProcess):
    """The bench's app (``python -m loadtest._bench_app``: idempay plus the bypass route,
    served with the options of ``idempay serve``) on the bench database, which
    ``prepare_database`` has migrated — or, with ``bypass=False``, ``idempay serve`` as
    shipped; one worker unless told, in its own process group, logging to a file; rate
    limits out of reach; connected to the acquirer host at ``acquirer_url`` (unset: the
    server starts its own child host, the embedded default)."""

    def __init__(
        self,
        database: str,
        log_path: Path,
        *,
        redis_url: str = "",
        redis_prefix: str = "",
        workers: int = 1,
        env: dict[str, str] | None = None,
        bypass: bool = True,
        acquirer_url: str = "",
    ) -> None:
        super().__init__(
            {
                "IDEMPAY_DATABASE_URL": database_url(database),
                "IDEMPAY_LOG_LEVEL": "WARNING",
                "IDEMPAY_RATE_LIMIT": "1000000/second",
                "IDEMPAY_RATE_LIMIT_TERMINAL": "1000000/second",
                "IDEMPAY_REDIS_URL": redis_url,
                "IDEMPAY_REDIS_PREFIX": redis_prefix or "idempay:",
                # the bench's own acquirer host (unset: each server starts a child host)
                **({"IDEMPAY_ACQUIRER_URL": acquirer_url} if acquirer_url else {}),
                **(env or {}),
            },
            log_path,
            workers=workers,
            cwd=ROOT,
        )
        self.bypass = bypass

    def command(self) -> list[str]:
        if not self.bypass:  # the server exactly as shipped
            return super().command()
        return [sys.executable, "-m", "loadtest._bench_app", "--port", str(self.port),
                "--workers", str(self.workers)]  # fmt: skip


def _proc_stats() -> list[tuple[str, int, float, str]]:
    """(comm, process group, CPU seconds incl. reaped children, command line) per process."""
    stats = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            raw = Path(entry.path, "stat").read_text()
            cmdline = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        comm = raw[raw.index("(") + 1 : raw.rindex(")")]
        fields = raw[raw.rindex(")") + 2 :].split()
        ticks = sum(int(value) for value in fields[11:15])  # utime stime cutime cstime
        stats.append((comm, int(fields[2]), ticks / _TICK, cmdline))
    return stats


def _counts_for(database: str, cmdline: str) -> bool:
    """A postgres process whose CPU is the bench's: its database's backends, the postmaster
    (its reaped-children time holds the backends that exited, e.g. pgbench's), and the
    shared auxiliaries (WAL writer, checkpointer, …). Other databases' backends are not."""
    is_backend = "127.0.0.1(" in cmdline or "[local]" in cmdline or "::1(" in cmdline
    return not is_backend or f" {database} " in cmdline


def _machine_busy() -> float:
    with open("/proc/stat") as stat:
        values = [int(v) for v in stat.readline().split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return (sum(values[:8]) - idle) / _TICK


@dataclass(frozen=True, slots=True)
class CpuSample:
    wall: float
    server: float
    postgres: float
    children: float
    machine: float
    acquirer: float = 0.0


def sample_cpu(server_pid: int, database: str, acquirer_pid: int = 0) -> CpuSample:
    """CPU so far of the server's process group, the bench database's Postgres processes,
    our reaped children, the machine — and the acquirer host's session when given."""
    server = postgres = acquirer = 0.0
    for comm, group, seconds, cmdline in _proc_stats():
        if group == server_pid:
            server += seconds
        elif acquirer_pid and group == acquirer_pid:
            acquirer += seconds
        elif comm == "postgres" and _counts_for(database, cmdline):
            postgres += seconds
    children = os.times()
    return CpuSample(
        wall=time.monotonic(),
        server=server,
        acquirer=acquirer,
        postgres=postgres,
        children=children.children_user + children.children_system,
        machine=_machine_busy(),
    )


def cpu_delta(before: CpuSample, after: CpuSample) -> dict[str, float]:
    """CPU seconds spent between two samples, and the wall time between them."""
    return {
        "wall_s": after.wall - before.wall,
        "server_s": after.server - before.server,
        "acquirer_s": after.acquirer - before.acquirer,
        "postgres_s": after.postgres - before.postgres,
        "children_s": after.children - before.children,
        "machine_s": after.machine - before.machine,
    }


def machine_info() -> dict[str, str | int]:
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "git": _git_revision(),
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_model": model,
        "python": platform.python_version(),
        "kernel": platform.release(),
        "hostname": platform.node(),
    }


def _git_revision() -> str:
    """HEAD's short hash, ``+dirty`` when the working tree differs (the code measured)."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return "unknown"
    return (head or "unknown") + ("+dirty" if dirty else "")


async def _postgres_settings(name: str) -> dict[str, str]:
    conn = await asyncpg.connect(pg_url(name, driver="postgresql"))
    try:
        version = await conn.fetchval("SHOW server_version")
        sync = await conn.fetchval("SHOW synchronous_commit")
        shared = await conn.fetchval("SHOW shared_buffers")
        autovacuum = await conn.fetchval("SHOW autovacuum")
    finally:
        await conn.close()
    return {
        "version": version,
        "synchronous_commit": sync,
        "shared_buffers": shared,
        "autovacuum": autovacuum,
    }


def postgres_settings(name: str) -> dict[str, str]:
    return asyncio.run(_postgres_settings(name))


async def _analyze(name: str) -> None:
    conn = await asyncpg.connect(pg_url(name, driver="postgresql"))
    try:
        await conn.execute("ANALYZE")
    finally:
        await conn.close()


def analyze(name: str) -> None:
    """``ANALYZE`` the bench database: what autovacuum does on a stock server, which this
    machine's shared Postgres runs without (``autovacuum = off``, its CI configuration).
    Without it, plans cached while the tables were empty are never refreshed — the create's
    ledger foreign-key check then walks every row of the merchant and the create decays
    round after round (docs/benchmarks.md, "Postgres without autovacuum";
    ``api/pg_checks.py`` warns an operator about it). The bench calls it before each round,
    outside the timed window.
    The Postgres is shared: when it has no free connection the ANALYZE is tried again a few
    times, then skipped for this round (said on stdout)."""
    for attempt in range(ANALYZE_ATTEMPTS):
        try:
            asyncio.run(_analyze(name))
            return
        except asyncpg.TooManyConnectionsError:
            time.sleep(1.0 + attempt)
    say(f"ANALYZE skipped: Postgres had no free connection in {ANALYZE_ATTEMPTS} tries")


_FREE_SLOTS = """
SELECT current_setting('max_connections')::int
     - current_setting('superuser_reserved_connections')::int
     - (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')
"""


async def _free_slots() -> int:
    conn = await asyncpg.connect(PG_ADMIN)
    try:
        return int(await conn.fetchval(_FREE_SLOTS))
    finally:
        await conn.close()


def free_connection_slots() -> int:
    """Connections Postgres can still accept (it is shared with everything on the machine)."""
    return asyncio.run(_free_slots()) + 1  # the probe's own connection is closed by now


_GROUP_COMMIT = re.compile(
    r'^idempay_group_commit_(transactions|writes)_total\{kind="(claim|finish)"\} ([0-9.e+]+)$',
    re.MULTILINE,
)


def group_commits(base_url: str) -> dict[str, float] | None:
    """The server's group-commit counters (``/metrics``): ``claim_transactions``,
    ``claim_writes``, ``finish_transactions``, ``finish_writes``; None if unreadable."""
    try:
        text = httpx.get(f"{base_url}/metrics", timeout=10).text
    except httpx.HTTPError:
        return None
    found = {f"{kind}_{what}": float(value) for what, kind, value in _GROUP_COMMIT.findall(text)}
    return found if len(found) == 4 else None
