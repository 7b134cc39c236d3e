"""Processes that lead by a Postgres lock (``idempay relay``, ``idempay webhooks``), as tests
stop them: started as real processes, stopped (SIGSTOP) at a moment the test chooses, and a
session left stuck mid-statement holding their lock, as a stopped process leaves it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import asyncpg

from tests.support.services import ROOT


@contextmanager
def api_process(
    args: list[str], env: Mapping[str, str], log: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """``python -m api <args>`` from the repository, ``env`` on top of this process's
    environment, its output in ``log``. At the exit: continued (a stopped process never sees
    SIGTERM) and terminated if still running, killed if it outlives 10 s."""
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "api", *args],
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            yield process
        finally:
            if process.poll() is None:
                os.kill(process.pid, signal.SIGCONT)
                process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)


def stop_process(pid: int) -> None:
    """SIGSTOP ``pid`` and return once it is stopped."""
    os.kill(pid, signal.SIGSTOP)
    stat = Path(f"/proc/{pid}/stat")
    while stat.read_text().rsplit(")", 1)[1].split()[0] != "T":
        time.sleep(0.001)


async def stop_while(
    pid: int, holding: Callable[[], Awaitable[bool]], *, what: str, within: float
) -> None:
    """Stop ``pid`` at a moment ``holding()`` is true, and check it still is once stopped —
    else let it run and try again, for ``within`` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not await holding():
            continue
        stop_process(pid)
        if await holding():
            return
        os.kill(pid, signal.SIGCONT)
    raise AssertionError(f"never caught {what} in {within} s")


async def stuck_session(
    dsn: str, application_name: str, lock: str, *args: object
) -> asyncpg.Connection:
    """A session stopped after asyncpg parsed a new statement and before it ran it (a new
    statement on a session is prepared first, then bound): "active", waiting for the rest,
    inside a transaction that ran ``lock`` with ``args`` (a statement taking the leaders'
    lock). The
    caller terminates it."""
    stuck = await asyncpg.connect(dsn, server_settings={"application_name": application_name})
    try:
        await stuck.transaction().start()
        await stuck.execute(lock, *args)
        await stuck.prepare("SELECT 1")  # parsed, never run: the session waits for the client
    except BaseException:
        stuck.terminate()
        raise
    return stuck
