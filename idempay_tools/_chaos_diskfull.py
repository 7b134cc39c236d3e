"""Chaos: the embedded SQLite's disk fills up under steady creates, then space is freed.

``disk_full_episode(root)`` runs one episode on its own, beside the Postgres run of
``make chaos`` (it needs root: a loop mount):

1. a small ext4 disk (``DISK_MIB``, a loop-mounted image under ``root``, no blocks kept for
   root) holds the SQLite database; ``idempay serve`` runs on it and ``CLIENTS`` clients
   send creates back to back, each under a new key, for the whole episode;
2. a runaway filler takes every free byte of the disk, again and again (every 0.1 s), until
   every create answered in the last second was refused (503; ``FULL_WAIT_S`` at most);
   then a key created before is sent again (201, replayed: the same body) and looked up
   (200) — nothing to write for either;
3. the filler stops and ``free_mib`` of it are freed (``FREE_MIB``); nothing else is done
   — no restart, no operator: ``WRITTEN_AFTER_FREE`` creates must be written after that
   (``RECOVER_WAIT_S`` at most), then the filler is removed and the reserve file next to
   the database must be laid down again (``RESERVE_WAIT_S``);
4. the load and the server stop; the checks: every create answered 201 is in the database
   (its key completed, its transaction there), every one answered 202 has its key stored,
   every one answered 503 left nothing; no answer but 201, 202 and 503 (the client's own
   timeouts are checked neither way); ``PRAGMA integrity_check`` ok; the WAL file never
   past ``WAL_CEILING_BYTES``.

The disk is unmounted and its image removed whatever happened (``LoopDisk``); an episode
told to stop (``stop``, set by ``Beside.stop`` when the chaos run is interrupted) ends at
its next wait, stopping its load and server and unmounting its disk, so the run's folder
can be removed; the filler never writes to a disk that is not mounted any more (it would
fill the file system underneath instead). The result
(``DiskFull``) says what was seen and lists what failed (``errors``; empty: it passed).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import sqlite3
import subprocess
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import httpx

from idempay_tools.serve_process import ServerProcess, say

DISK_MIB = 48
FREE_MIB = 4
CLIENTS = 8
WARMUP_S = 3.0
FULL_HOLD_S = 3.0  # 503s for this long before space is freed
FULL_WAIT_S = 60.0  # the disk must be seen full (a 503) within this
RECOVER_WAIT_S = 60.0  # a create sent after the space was freed must be answered 201 by then
# Creates that must be written after FREE_MIB were freed: about a quarter of what that space
# holds as database pages. Before the WAL was bounded, the WAL took the freed space and about
# 60 creates later the server answered 503 for good (the checkpoint could not grow the file).
WRITTEN_AFTER_FREE = 300
RESERVE_WAIT_S = 15.0  # the filler removed: the reserve must be back by then
AFTER_S = 2.0  # creates keep coming this long after the recovery
# The WAL's bound as docs/operations.md states it: WAL_RESTART_PAGES (4 MiB), plus the
# batches committed while a restart is pending (a batch of 256 creates can write a few MiB).
WAL_CEILING_BYTES = 16 * 1024 * 1024
ENV = {
    "IDEMPAY_REDIS_URL": "",
    "IDEMPAY_RATE_LIMIT": "100000/second",
    "IDEMPAY_RATE_LIMIT_TERMINAL": "100000/second",
    "IDEMPAY_EVENT_FLUSH_INTERVAL": "0.2",
}


class LoopDisk:
    """An ext4 image of ``mib`` MiB under ``folder``, loop-mounted at ``folder/mnt`` (no
    blocks reserved for root: full means full for everyone). ``close`` unmounts it (lazily
    if it is still busy) and removes the image."""

    def __init__(self, folder: Path, mib: int = DISK_MIB) -> None:
        self.folder = folder
        self.image = folder / "disk.img"
        self.mount = folder / "mnt"
        self.mib = mib
        self.mounted = False

    def __enter__(self) -> Self:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.mount.mkdir(exist_ok=True)
        try:
            subprocess.run(["truncate", "-s", f"{self.mib}M", str(self.image)], check=True)
            subprocess.run(
                ["mkfs.ext4", "-q", "-F", "-m", "0", str(self.image)],
                check=True, capture_output=True,
            )  # fmt: skip
            subprocess.run(
                ["mount", "-o", "loop", str(self.image), str(self.mount)],
                check=True, capture_output=True,
            )  # fmt: skip
            self.mounted = True
            atexit.register(self.close)  # the harness exiting mid-episode leaves no mount
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.mounted:
            done = subprocess.run(["umount", str(self.mount)], capture_output=True)
            if done.returncode != 0:
                subprocess.run(["umount", "-l", str(self.mount)], capture_output=True)
            self.mounted = False
        with contextlib.suppress(OSError):
            self.image.unlink()

    def free_bytes(self) -> int:
        stat = os.statvfs(self.mount)
        return stat.f_bavail * stat.f_frsize

    def leave_free(self, mib: int, name: str = "taken") -> Path:
        """A file taking every free byte of the disk but ``mib`` MiB (fsynced)."""
        path = self.mount / name
        with path.open("wb") as taken:
            taken.write(b"\1" * (self.free_bytes() - mib * 2**20))
            taken.flush()
            os.fsync(taken.fileno())
        return path

    def fill(self, name: str = "filler") -> Path:
        """A file taking every free byte of the disk (written until ENOSPC, fsynced).
        ``RuntimeError`` when the disk is not mounted (any more): what it would fill is
        the file system underneath."""
        if not os.path.ismount(self.mount):
            raise RuntimeError(f"{self.mount} is not mounted: nothing filled")
        path = self.mount / name
        chunk = b"\0" * (1024 * 1024)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            for size in (len(chunk), 64 * 1024, 4096):
                while True:
                    try:
                        os.write(fd, chunk[:size])
                    except OSError:
                        break
            with contextlib.suppress(OSError):
                os.fsync(fd)
        finally:
            os.close(fd)
        return path

    @staticmethod
    def free(path: Path, mib: int) -> None:
        """Give ``mib`` MiB of ``path`` back to the disk."""
        size = path.stat().st_size
        os.truncate(path, max(0, size - mib * 1024 * 1024))


@dataclass
class Answer:
    key: str
    sent: float  # monotonic
    status: int | None  # None: no answer (the client's timeout, a connection error)


class Load:
    """``clients`` clients sending creates back to back, each under a new key, in a thread
    of their own; every answer recorded. ``wal``: a WAL file whose size is sampled beside
    them (``wal_max``)."""

    def __init__(self, url: str, api_key: str, *, clients: int = CLIENTS, wal: Path | None = None):
        self.url, self.api_key, self.clients, self.wal = url, api_key, clients, wal
        self.answers: list[Answer] = []
        self.wal_max = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="diskfull-load", daemon=True)

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def counts(self) -> Counter[int | None]:
        return Counter(a.status for a in list(self.answers))

    def written_since(self, moment: float) -> int:
        return sum(1 for a in list(self.answers) if a.status == 201 and a.sent >= moment)

    def first(self, status: int, after: float) -> Answer | None:
        return next((a for a in list(self.answers) if a.status == status and a.sent >= after), None)

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        async with httpx.AsyncClient(base_url=self.url, timeout=10.0) as client:
            tasks = [asyncio.create_task(self._client(client, i)) for i in range(self.clients)]
            if self.wal is not None:
                tasks.append(asyncio.create_task(self._sample()))
            await asyncio.gather(*tasks)

    async def _client(self, client: httpx.AsyncClient, index: int) -> None:
        body = {
            "terminal_id": f"DISKFULL-{index}",
            "amount": 1250,
            "currency": "BRL",
            "card": {"token": "tok_visa_4242", "last4": "4242", "brand": "visa"},
        }
        while not self._stop.is_set():
            key = str(uuid.uuid4())
            sent = time.monotonic()
            status: int | None
            try:
                response = await client.post(
                    "/v1/transactions",
                    json=body,
                    headers={"Authorization": f"Bearer {self.api_key}", "Idempotency-Key": key},
                )
                status = response.status_code
            except httpx.HTTPError:
                status = None
            self.answers.append(Answer(key, sent, status))
            if status == 503:
                await asyncio.sleep(0.02)  # a client honouring Retry-After would wait longer

    async def _sample(self) -> None:
        assert self.wal is not None
        while not self._stop.is_set():
            with contextlib.suppress(OSError):
                self.wal_max = max(self.wal_max, self.wal.stat().st_size)
            await asyncio.sleep(0.02)


@dataclass
class DiskFull:
    """What one episode saw; ``errors`` empty: it passed."""

    counts: dict[str, int] = field(default_factory=dict)  # answer status → creates
    full_s: float | None = None  # from the disk filled to the first 503
    recover_s: float | None = None  # from the space freed to a create answered 201
    wal_max_bytes: int = 0
    replayed_while_full: bool = False  # a known key's replay and lookup answered meanwhile
    written_after_free: int = 0  # creates answered 201 sent after the space was freed
    reserve_back: bool = False  # the reserve file was laid down again once there was room
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    def summary(self) -> str:
        recover = "never" if self.recover_s is None else f"{self.recover_s:.1f} s"
        return (
            f"SQLite disk full: answers {self.counts}; recovered {recover} after space was "
            f"freed; WAL at most {self.wal_max_bytes / 2**20:.1f} MiB"
            + ("" if self.ok else f"; FAILED: {'; '.join(self.errors)}")
        )


class Stopped(Exception):
    """The episode was told to stop (the run is being interrupted)."""


def disk_full_episode(
    root: Path,
    *,
    free_mib: int = FREE_MIB,
    deadline_s: float = 240.0,
    registry: Any = None,
    stop: threading.Event | None = None,
) -> DiskFull:
    """One episode in ``root`` (created; left for the caller to remove). Never raises for
    what it finds: failures are in the result's ``errors``. ``registry``: the chaos run's
    PID registry (``_chaos_reaper``), told of the episode's server. ``stop``: once set,
    the episode ends at its next wait (its disk unmounted), failed "stopped"."""
    result = DiskFull()
    stop = stop or threading.Event()
    if os.geteuid() != 0:
        result.errors.append("the SQLite disk-full episode needs root (a loop mount)")
        return result
    root.mkdir(parents=True, exist_ok=True)
    try:
        with LoopDisk(root / "disk") as disk:
            _episode(root, disk, result, time.monotonic() + deadline_s, free_mib, registry, stop)
    except Stopped:
        result.errors.append("stopped before it finished (the run is stopping)")
    except Exception as exc:  # the episode's own failure (mount, start): reported, not raised
        result.errors.append(f"the episode failed: {type(exc).__name__}: {exc}")
    return result


def _episode(
    root: Path,
    disk: LoopDisk,
    result: DiskFull,
    deadline: float,
    free_mib: int,
    registry: Any,
    stop: threading.Event,
) -> None:
    def _wait(found: Any, until: float) -> Any:
        return _wait_unless(found, until, stop)

    database = disk.mount / "idempay.db"
    env = {
        **ENV,
        "IDEMPAY_DATABASE_URL": f"sqlite+aiosqlite:///{database}",
        "IDEMPAY_VAR_DIR": str(root / "var"),
    }
    api_key = _prepare(env)
    server = ServerProcess(env, root / "diskfull-api.log")
    server.launch()
    if registry is not None:
        assert server.proc is not None
        registry.add(server.proc.pid, "diskfull-api", group=True)
    atexit.register(server.kill)
    if _wait(lambda: server.is_ready() or None, time.monotonic() + 60.0) is None:
        server.kill()
        raise RuntimeError(f"the server on the small disk did not start:\n{server.log_tail()}")
    load = Load(server.url, api_key, wal=Path(f"{database}-wal")).start()
    filler = disk.mount / "filler"
    refilling = threading.Event()
    refiller = threading.Thread(target=_refill, args=(disk, refilling, stop), daemon=True)
    known = str(uuid.uuid4())  # a key processed before the disk fills: replayed while full
    try:
        first = _send(server.url, api_key, known)
        if first.status_code != 201:
            result.errors.append(f"the known key's create answered {first.status_code}")
        if stop.wait(WARMUP_S):
            raise Stopped
        filled = time.monotonic()
        refilling.set()
        refiller.start()  # a runaway neighbour: any space that frees up is taken again
        full = _wait(lambda: _steady_503(load), min(deadline, filled + FULL_WAIT_S))
        if full is None:
            result.errors.append(f"creates were not refused within {FULL_WAIT_S:.0f} s")
        else:
            result.full_s = time.monotonic() - filled
            _replay_while_full(server.url, api_key, known, first, result)
        refilling.clear()
        refiller.join(10.0)
        freed = time.monotonic()
        LoopDisk.free(filler, free_mib)
        say(f"chaos: disk full: {free_mib} MiB freed; waiting for a create to be written")
        back = _wait(lambda: load.first(201, freed), min(deadline, freed + RECOVER_WAIT_S))
        if back is not None:
            result.recover_s = time.monotonic() - freed
        enough = _wait(
            lambda: load.written_since(freed) >= WRITTEN_AFTER_FREE or None,
            min(deadline, freed + RECOVER_WAIT_S),
        )
        result.written_after_free = load.written_since(freed)
        if enough is None:
            result.errors.append(
                f"{result.written_after_free} creates written in the {RECOVER_WAIT_S:.0f} s after"
                f" {free_mib} MiB were freed (wanted {WRITTEN_AFTER_FREE}: the space must go"
                " to the database, not to a WAL that cannot be checkpointed)"
            )
            return
        filler.unlink()  # room again: the reserve is laid down again
        reserve = Path(f"{database}-reserve")
        if _wait(lambda: _holds(reserve), min(deadline, time.monotonic() + RESERVE_WAIT_S)):
            result.reserve_back = True
        else:
            result.errors.append(
                f"the reserve was not laid down again within {RESERVE_WAIT_S:.0f} s"
            )
        if stop.wait(AFTER_S):
            raise Stopped
    finally:
        refilling.clear()
        load.stop()
        server.stop(timeout=15.0)
        result.counts = {str(k): v for k, v in sorted(load.counts().items(), key=str)}
        result.wal_max_bytes = load.wal_max
    _check(database, load, result)


BODY = {
    "terminal_id": "DISKFULL-KNOWN",
    "amount": 990,
    "currency": "BRL",
    "card": {"token": "tok_visa_4242", "last4": "4242", "brand": "visa"},
}


def _send(url: str, api_key: str, key: str) -> httpx.Response:
    headers = {"Authorization": f"Bearer {api_key}", "Idempotency-Key": key}
    return httpx.post(f"{url}/v1/transactions", json=BODY, headers=headers, timeout=10.0)


def _replay_while_full(
    url: str, api_key: str, key: str, first: httpx.Response, result: DiskFull
) -> None:
    """While every new create is refused, a key processed before is still answered: its
    replay (the same body) and its lookup — nothing to write for either."""
    replay = _send(url, api_key, key)
    if replay.status_code != 201 or replay.headers.get("Idempotent-Replayed") != "true":
        result.errors.append(f"a replay while the disk was full answered {replay.status_code}")
    elif replay.content != first.content:
        result.errors.append("a replay while the disk was full answered another body")
    lookup = httpx.get(
        f"{url}/v1/transactions/{key}",
        headers={"Authorization": f"Bearer {api_key}"},
        timeout=10.0,
    )
    if lookup.status_code != 200:
        result.errors.append(f"a lookup while the disk was full answered {lookup.status_code}")
    result.replayed_while_full = not result.errors


def _refill(disk: LoopDisk, on: threading.Event, stop: threading.Event) -> None:
    while on.is_set() and not stop.is_set():
        try:
            disk.fill()
        except RuntimeError:  # unmounted under it (the run stopping): never fill the rest
            return
        time.sleep(0.1)


def _steady_503(load: Load) -> bool | None:
    """True once every create answered in the last second was refused (at least five)."""
    now = time.monotonic()
    recent = [a.status for a in list(load.answers)[-200:] if now - a.sent <= 1.0]
    return True if len(recent) >= 5 and all(s == 503 for s in recent) else None


def _holds(reserve: Path) -> bool | None:
    try:
        return True if reserve.stat().st_size > 0 else None
    except OSError:
        return None


def _prepare(env: dict[str, str]) -> str:
    """The schema migrated and an API key made, on the disk's database."""
    from api.auth import create_api_key
    from api.config import Settings
    from api.db import create_engine
    from api.migrate import migrate

    settings = Settings(
        database_url=env["IDEMPAY_DATABASE_URL"], var_dir=Path(env["IDEMPAY_VAR_DIR"])
    )
    migrate(settings)

    async def key() -> str:
        engine = create_engine(settings)
        try:
            return await create_api_key(engine, "chaos-diskfull")
        finally:
            await engine.dispose()

    return asyncio.run(key())


def _wait_unless(found: Any, until: float, stop: threading.Event) -> Any:
    """``found()`` until it is not None or ``until`` (monotonic); ``Stopped`` once
    ``stop`` is set."""
    while time.monotonic() < until:
        if stop.is_set():
            raise Stopped
        answer = found()
        if answer is not None:
            return answer
        time.sleep(0.05)
    return None


def _check(database: Path, load: Load, result: DiskFull) -> None:
    """Every answer against the database: 201 written, 503 not; nothing else answered."""
    others = {k: v for k, v in load.counts().items() if k not in (201, 202, 503, None)}
    if others:
        result.errors.append(f"answers other than 201, 202 and 503: {others}")
    if load.first(201, 0.0) is None:
        result.errors.append("no create was answered 201")
    if result.wal_max_bytes > WAL_CEILING_BYTES:
        result.errors.append(
            f"the WAL grew to {result.wal_max_bytes} bytes (ceiling {WAL_CEILING_BYTES})"
        )
    db = sqlite3.connect(database)
    try:
        integrity = db.execute("PRAGMA integrity_check").fetchone()[0]
        if integrity != "ok":
            result.errors.append(f"integrity_check: {integrity}")
        written = {
            row[0]
            for row in db.execute(
                'SELECT k.key FROM idempotency_key k JOIN "transaction" t'
                " ON t.merchant_id = k.merchant_id AND t.id = k.key WHERE k.state = 'completed'"
            )
        }
        keys = {row[0] for row in db.execute("SELECT key FROM idempotency_key")}
    finally:
        db.close()
    lost = [a.key for a in load.answers if a.status == 201 and a.key not in written]
    lost += [a.key for a in load.answers if a.status == 202 and a.key not in keys]
    ghosts = [a.key for a in load.answers if a.status == 503 and a.key in keys]
    if lost:
        result.errors.append(f"{len(lost)} creates answered 201 are not written, e.g. {lost[0]}")
    if ghosts:
        result.errors.append(f"{len(ghosts)} creates answered 503 were written, e.g. {ghosts[0]}")


class Beside:
    """The episode in a thread of its own, started now (``make chaos`` runs it beside the
    fleet); ``finish`` waits for it and adds what failed to ``errors``."""

    def __init__(self, root: Path, errors: list[str], registry: Any = None) -> None:
        self.errors = errors
        self.result: DiskFull | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(root, registry), name="sqlite-disk-full", daemon=True
        )
        self._thread.start()

    def _run(self, root: Path, registry: Any) -> None:
        say("chaos: disk full: the SQLite disk-full episode starts (a 48 MiB loop disk)")
        self.result = disk_full_episode(root, registry=registry, stop=self._stop)
        say(f"chaos: {self.result.summary()}")

    def stop(self, timeout: float = 30.0) -> bool:
        """The run is stopping: end the episode now (its load, its server, its disk
        unmounted); False when it had not ended within ``timeout``."""
        self._stop.set()
        self._thread.join(max(0.0, timeout))
        return not self._thread.is_alive()

    def finish(self, timeout: float) -> DiskFull | None:
        self._thread.join(max(0.0, timeout))
        if self.result is None:
            self.errors.append("sqlite disk full: the episode did not finish in time")
        else:
            self.errors.extend(f"sqlite disk full: {error}" for error in self.result.errors)
        return self.result
