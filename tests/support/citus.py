"""A private Citus cluster for tests (issue 18): a coordinator and two workers on localhost,
started by ``scripts/citus.sh`` (which builds and installs the extension the first time,
from ../shared/vendor) in a folder of the test session, and stopped by data directory.

Each test module takes a database of its own on the cluster (``CitusCluster.database``):
created on every node with the extension, the workers registered in its metadata, migrated
(``idempay migrate`` distributes the tables). Nodes are stopped and started by data
directory, never by name; the machine's shared PostgreSQL is never touched.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import asyncpg

from tests.support.client import Api
from tests.support.services import ROOT

if TYPE_CHECKING:
    from tests.support.backend import Backend

SCRIPT = ROOT / "scripts" / "citus.sh"
PG_BIN = Path("/usr/lib/postgresql/15/bin")
NODES = ("coordinator", "worker1", "worker2")
BUILD_TIMEOUT = 1800.0  # the first build on a fresh machine: ~5 minutes on 2 cores


def _as_postgres(command: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


@dataclass
class Node:
    name: str
    root: Path

    @property
    def port(self) -> int:
        return int((self.root / "port").read_text())

    @property
    def data(self) -> Path:
        return self.root / "data"

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def pid(self) -> int | None:
        try:
            pid = int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        try:
            os.kill(pid, 0)
        except OSError:
            return None
        return pid

    def pg_ctl(self, *args: str, timeout: float = 90.0) -> None:
        command = [str(PG_BIN / "pg_ctl"), "-D", str(self.data), *args]
        done = subprocess.run(
            _as_postgres(command), capture_output=True, text=True, timeout=timeout
        )
        if done.returncode != 0:
            log = (self.root / "log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"pg_ctl {args} on {self.name}: {done.stdout}{done.stderr}{log}")

    def kill(self) -> None:
        """Stop at once, as a crashed machine would (no checkpoint, no goodbye to clients)."""
        self.pg_ctl("-m", "immediate", "-w", "stop")

    def start(self) -> None:
        self.pg_ctl("-l", str(self.root / "log"), "-w", "-t", "60", "start")


class CitusCluster:
    """``scripts/citus.sh start DIR`` once; ``stop`` at the end of the session."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.nodes = {name: Node(name, root / name) for name in NODES}

    @property
    def coordinator(self) -> Node:
        return self.nodes["coordinator"]

    @property
    def workers(self) -> list[Node]:
        return [self.nodes["worker1"], self.nodes["worker2"]]

    def start(self) -> CitusCluster:
        done = subprocess.run(
            [str(SCRIPT), "start", str(self.root)],
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT,
        )
        if done.returncode != 0:
            raise RuntimeError(f"scripts/citus.sh start failed:\n{done.stdout}{done.stderr}")
        return self

    def stop(self) -> None:
        subprocess.run([str(SCRIPT), "stop", str(self.root)], capture_output=True, timeout=180)

    def coordinator_dsn(self, backend: Backend) -> str:
        """The coordinator's DSN for ``backend``'s database."""
        return self.coordinator.dsn(backend.url.rsplit("/", 1)[1])

    def node_of_port(self, port: int) -> Node:
        return next(node for node in self.nodes.values() if node.port == port)

    def database(self, prefix: str = "idempay_citus") -> str:
        """A new database on every node, with the extension, its workers registered."""
        name = f"{prefix}_{uuid.uuid4().hex[:8]}"

        async def create() -> None:
            for node in self.nodes.values():
                await execute(node.dsn(), f'CREATE DATABASE "{name}"')
                await execute(node.dsn(name), "CREATE EXTENSION citus")
            coordinator = self.coordinator.dsn(name)
            await execute(coordinator, "CREATE EXTENSION pg_stat_statements")  # for citus_stat_…
            await execute(
                coordinator,
                f"SELECT citus_set_coordinator_host('127.0.0.1', {self.coordinator.port})",
            )
            for worker in self.workers:
                await execute(coordinator, f"SELECT citus_add_node('127.0.0.1', {worker.port})")

        asyncio.run(create())
        return name

    def url(self, database: str) -> str:
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.coordinator.port}/{database}"


TEST_APP = "idempay-test"  # the application_name of the tests' own connections


async def _connect(dsn: str) -> asyncpg.Connection:
    return await asyncpg.connect(dsn, server_settings={"application_name": TEST_APP})


async def execute(dsn: str, statement: str, *args: Any) -> None:
    conn = await _connect(dsn)
    try:
        await conn.execute(statement, *args)
    finally:
        await conn.close()


async def fetch(dsn: str, statement: str, *args: Any) -> list[asyncpg.Record]:
    conn = await _connect(dsn)
    try:
        return list(await conn.fetch(statement, *args))
    finally:
        await conn.close()


def query(dsn: str, statement: str, *args: Any) -> list[asyncpg.Record]:
    return asyncio.run(fetch(dsn, statement, *args))


def execute_sync(dsn: str, statement: str, *args: Any) -> None:
    asyncio.run(execute(dsn, statement, *args))


# --------------------------------------------------------------- statements, as logged
# scripts/citus.sh sets log_line_prefix = '%m [%p] db=%d app=%a '; with log_statement = all
# a client's statement is one entry (its SQL runs on over lines without the prefix) and its
# parameters the next ("DETAIL:  parameters: $1 = '…', $2 = NULL").
_ENTRY = re.compile(
    r"^(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+) \w+ \[(?P<pid>\d+)\] "
    r"db=(?P<db>\S*) app=(?P<app>\S*) (?P<level>[A-Z]+):  (?P<text>.*)$"
)
_STATEMENT = re.compile(r"^(?:execute [^:]+|statement): (?P<sql>.*)$", re.S)
_PARAMETER = re.compile(r"\$(\d+) = ('(?:[^']|'')*'|NULL)")


@dataclass(frozen=True)
class LoggedStatement:
    sql: str
    parameters: tuple[str, ...]  # SQL literals, in $n order


def logged_statements(node: Node, database: str, *, since: float) -> list[LoggedStatement]:
    """The statements clients other than the tests ran on ``database`` since ``since``."""
    entries: list[dict[str, str]] = []
    for line in (node.root / "log").read_text(errors="replace").splitlines():
        match = _ENTRY.match(line)
        if match:
            entries.append(match.groupdict())
        elif entries:
            entries[-1]["text"] += "\n" + line
    found: list[LoggedStatement] = []
    for entry, following in zip(entries, [*entries[1:], None], strict=True):
        if entry["db"] != database or entry["app"] == TEST_APP or entry["level"] != "LOG":
            continue
        moment = datetime.strptime(entry["ts"], "%Y-%m-%d %H:%M:%S.%f").timestamp()
        statement = _STATEMENT.match(entry["text"])
        if statement is None or moment < since - 1:  # the log's clock is UTC, like time()
            continue
        parameters: tuple[str, ...] = ()
        if (
            following
            and following["pid"] == entry["pid"]
            and following["text"].startswith("parameters: ")
        ):
            pairs = _PARAMETER.findall(following["text"])
            parameters = tuple(value for _, value in sorted(pairs, key=lambda p: int(p[0])))
        found.append(LoggedStatement(statement["sql"].strip(), parameters))
    return found


def explain(dsn: str, statement: LoggedStatement) -> str:
    """EXPLAIN of a logged statement with its own parameters (a custom plan, as the first
    executions of a prepared statement get)."""

    async def run() -> str:
        conn = await _connect(dsn)
        try:
            await conn.execute(f"PREPARE idempay_explained AS {statement.sql}")
            values = f"({', '.join(statement.parameters)})" if statement.parameters else ""
            rows = await conn.fetch(f"EXPLAIN (COSTS OFF) EXECUTE idempay_explained{values}")
            return "\n".join(row[0] for row in rows)
        except asyncpg.PostgresError as exc:  # a plan that cannot be made is no single shard
            return f"ERROR: {exc}"
        finally:
            await conn.close()

    return asyncio.run(run())


def wait_until(predicate: Any, what: str, timeout: float = 60.0, every: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
        except Exception as exc:  # noqa: BLE001 - a probe of a node that is coming back
            last = exc
        if last and not isinstance(last, Exception):
            return last
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


def shard_node_port(dsn: str, table: str, merchant_id: str) -> int:
    """The port of the worker holding ``merchant_id``'s shard of ``table``."""
    rows = query(
        dsn,
        "SELECT nodeport FROM pg_dist_shard_placement WHERE shardid = "
        "get_shard_id_for_distribution_column($1::regclass, $2::text)",
        table,
        merchant_id,
    )
    return int(rows[0]["nodeport"])


def merchants_by_worker(dsn: str, merchant_ids: Sequence[str]) -> dict[int, list[str]]:
    placed: dict[int, list[str]] = {}
    for merchant_id in merchant_ids:
        placed.setdefault(shard_node_port(dsn, "idempotency_key", merchant_id), []).append(
            merchant_id
        )
    return placed


def spread_merchants(
    backend: Backend, url: str, dsn: str, *, name: str, table: str, per_worker: int
) -> dict[int, dict[str, Api]]:
    """New merchants (``{name}-0``, ``{name}-1``, …) until each worker holds ``per_worker`` of
    them by their shard of ``table``: worker port → merchant id → its API on ``url``."""
    placed: dict[int, dict[str, Api]] = {}
    number = 0
    while len(placed) < 2 or min(len(m) for m in placed.values()) < per_worker:
        merchant = f"{name}-{number}"
        api = Api(url, backend.api_key(merchant))
        merchant_id = query(dsn, "SELECT id FROM merchant WHERE name = $1", merchant)[0][0]
        port = shard_node_port(dsn, table, merchant_id)
        if len(placed.get(port, {})) < per_worker:
            placed.setdefault(port, {})[merchant_id] = api
        number += 1
    return placed


def first_worker_down(
    placed: dict[int, dict[str, Api]],
) -> tuple[int, set[str], set[str], dict[str, Api]]:
    """``placed`` (``spread_merchants``) split for a worker to stop: the lowest port, its
    merchants, the other workers' merchants, and every merchant's API."""
    victim_port = sorted(placed)[0]
    on_victim = set(placed[victim_port])
    elsewhere = {m for port, ms in placed.items() if port != victim_port for m in ms}
    apis = {m: api for ms in placed.values() for m, api in ms.items()}
    return victim_port, on_victim, elsewhere, apis
