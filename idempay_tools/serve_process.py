"""``python -m api serve`` as a child process: the one launcher behind the tests' servers,
``make bench``, ``make loadtest``, ``make chaos`` and ``idempay simulate``.

The server runs in its own session (so a signal reaches uvicorn's supervisor and every
worker), on a free loopback port, with the caller's environment on top of ours, logging
to a file; ``start`` returns once ``/readyz`` answers 200.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Self

from api.acquirer.host.process import free_port  # the one port picker (never a port twice)

__all__ = ["ServerProcess", "free_port", "ready", "say"]

LOCAL = "127.0.0.1"


def say(text: str) -> None:
    """A line on stdout, flushed (the harnesses' progress is read live)."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def ready(url: str) -> bool:
    """``/readyz`` answers 200 (storage reachable)."""
    try:
        with urllib.request.urlopen(f"{url}/readyz", timeout=1.0) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


class ServerProcess:
    """One ``idempay serve`` process tree; ``env`` is laid over ``os.environ``."""

    def __init__(
        self,
        env: Mapping[str, str],
        log_path: Path,
        *,
        workers: int = 1,
        args: Sequence[str] = (),
        cwd: Path | None = None,
    ) -> None:
        self.env = {**os.environ, **env}
        self.log_path = log_path
        self.workers = workers
        self.args = tuple(args)
        self.cwd = cwd
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{LOCAL}:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    def command(self) -> list[str]:
        return [sys.executable, "-m", "api", "serve", "--port", str(self.port),
                "--workers", str(self.workers), *self.args]  # fmt: skip

    def launch(self) -> None:
        """Start the process without waiting for it to be ready."""
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.command(),
                cwd=self.cwd,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def start(self, *, timeout: float = 60.0) -> Self:
        self.launch()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"server exited:\n{self.log_tail()}")
            if self.is_ready():
                return self
            time.sleep(0.1)
        raise RuntimeError(f"server not ready after {timeout:.0f}s:\n{self.log_tail()}")

    def is_ready(self) -> bool:
        return ready(self.url)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL the whole process group: no shutdown hooks, no flush."""
        if self.alive():
            assert self.proc is not None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, *, timeout: float = 15.0) -> None:
        """SIGTERM (uvicorn drains and the app flushes its events), SIGKILL after ``timeout``."""
        if not self.alive():
            return
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
