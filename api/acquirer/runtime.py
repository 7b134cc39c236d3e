"""The acquirer as the server sees it at run time: the link, and — on the embedded default —
the simulated acquirer host as a child process (contract §6).

With ``IDEMPAY_ACQUIRER_URL`` the server connects to that acquirer and never starts one.
Without it, it starts ``python -m api.acquirer.host`` on a free loopback port with its store
under ``IDEMPAY_VAR_DIR`` (``acquirer.sqlite3``), says so in its start-up line, and stops it
at shutdown: the embedded default, like SQLite. ``idempay serve`` starts that child once,
before its workers, and hands them its URL; each worker then only connects.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import structlog

from api.acquirer.link import AcquirerLink
from api.acquirer.types import ReversalRequest
from api.config import Settings
from api.db import assert_no_transaction
from api.metrics import ACQUIRER_LATE_ANSWERS, ACQUIRER_LINK_UP

log = structlog.get_logger("idempay.acquirer")

START_TIMEOUT_S = 30.0
_LISTENING = re.compile(r"listening on (iso8583://\S+)")


def _forward(stream: IO[bytes]) -> None:
    """Copy the child host's log lines to this process's stdout until it closes them."""
    for line in iter(stream.readline, b""):
        try:
            sys.stdout.buffer.write(line)
            sys.stdout.flush()
        except (OSError, ValueError):  # our stdout closed: drop, but keep draining
            continue


def _die_with_parent() -> None:
    """In the child before exec (Linux): SIGTERM it when its parent dies, however the
    parent ends (SIGKILL included), so no child host outlives the server that started it."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return


@dataclass
class ChildHost:
    """A simulated acquirer host this process started (and stops)."""

    url: str
    process: subprocess.Popen[bytes]
    store: Path

    @classmethod
    def start(cls, store: Path, *, slow_seconds: float) -> ChildHost:
        store.parent.mkdir(parents=True, exist_ok=True)
        command = [
            sys.executable,
            "-m",
            "api.acquirer.host",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--store",
            str(store),
            "--slow-seconds",
            str(slow_seconds),
        ]
        process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=None,
            env=os.environ.copy(),
            preexec_fn=_die_with_parent,
            # a session of its own: a signal to the server's process group (Ctrl-C, kill --
            # -PGID) reaches the server only; the server stops its host after the drain
            # (``close``, ``idempay serve``), the parent-death signal if the server dies
            start_new_session=True,
        )
        assert process.stdout is not None
        line = process.stdout.readline().decode(errors="replace")
        found = _LISTENING.search(line)
        if found is None:
            process.kill()
            raise RuntimeError(f"the acquirer host did not start: {line.strip()!r}")
        # its JSON log lines join the server's own stream; a pipe nobody read would fill
        # (64 KiB) and block the host's event loop on its next log line
        threading.Thread(
            target=_forward, args=(process.stdout,), name="acquirer-host-log", daemon=True
        ).start()
        return cls(url=found.group(1), process=process, store=store)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class AcquirerRuntime:
    def __init__(
        self, link: AcquirerLink, child: ChildHost | None, *, advice_timeout_s: float
    ) -> None:
        self.link = link
        self.child = child
        # an advice waits for its 0430 as long as a sale waits for its 0210: an acquirer slow
        # but within the sale timeout must be able to acknowledge it
        self.advice_timeout_s = advice_timeout_s
        self._late_seen = 0

    def observe(self) -> None:
        """Publish the link's state and its late answers (answers that came after their
        request's timeout) as metrics; called by the advice worker's every pass."""
        ACQUIRER_LINK_UP.set(1 if self.link.state == "up" else 0)
        late = self.link.late_answers
        if late > self._late_seen:
            ACQUIRER_LATE_ANSWERS.inc(late - self._late_seen)
        self._late_seen = late

    @classmethod
    async def open(cls, settings: Settings) -> AcquirerRuntime:
        child = None
        url = settings.acquirer_url
        if not url:
            store = settings.var_dir / "acquirer.sqlite3"
            # on the event loop's own thread, at start-up: the child's parent-death signal
            # follows the thread that started it (a pool thread could end before the app)
            child = ChildHost.start(store, slow_seconds=settings.acquirer_slow_seconds)
            url = child.url
            log.info("acquirer_child_started", url=url, store=str(store), pid=child.process.pid)
        link = AcquirerLink(
            url,
            connections=settings.acquirer_connections,
            assert_no_transaction=assert_no_transaction,
        )
        try:
            await link.start()
        except BaseException:
            if child is not None:
                child.stop()
            raise
        return cls(link, child, advice_timeout_s=settings.acquirer_timeout)

    async def advise(self, request: ReversalRequest) -> bool:
        return await self.link.advise(request, timeout_s=self.advice_timeout_s)

    async def close(self) -> None:
        await self.link.close()
        if self.child is not None:
            await asyncio.to_thread(self.child.stop)
