"""The acquirer host as a child process, for the tests and the harnesses.

``AcquirerProcess(...).start()`` runs ``python -m api.acquirer.host`` in its own session
on a free loopback port with a control socket, logging to a file, and returns once a
sign-on (0800/0810) is answered. ``url`` is the ``iso8583://`` URL for
``IDEMPAY_ACQUIRER_URL``; ``stop()`` is SIGTERM (the store is closed cleanly), ``kill()``
SIGKILL. :func:`start_acquirer` is the one-call form returning (url, control port, store
path, Popen).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Self

from api.acquirer.framing import frame
from api.acquirer.host.faults import control

__all__ = ["LOCAL", "AcquirerProcess", "free_port", "sign_on", "start_acquirer", "stop_pid"]

LOCAL = "127.0.0.1"


_GIVEN: set[int] = set()


def free_port() -> int:
    """A loopback port nothing listens on now, never one this process was given before:
    the kernel hands a port just released out again, so two ports asked for one after
    the other (a PostgreSQL's and a Patroni REST API's, an acquirer host's two) could be
    the same one. Every harness of the project takes its ports here."""
    while True:
        with socket.socket() as sock:
            sock.bind((LOCAL, 0))
            port = int(sock.getsockname()[1])
        if port not in _GIVEN:
            _GIVEN.add(port)
            return port


def sign_on(port: int, *, host: str = LOCAL, timeout: float = 2.0) -> bool:
    """One 0800 sign-on on a fresh connection; True when a 0810 ``00`` comes back."""
    from api.acquirer.messages import SIGN_ON, network_request, parse_answer

    request = network_request(SIGN_ON, stan="000001", transmitted_at=datetime.now(UTC))
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(frame(request))
            size = int.from_bytes(_read(sock, 2), "big")
            reply = parse_answer(_read(sock, size))
    except (OSError, ValueError):
        return False
    return reply.mti == "0810" and reply.response_code == "00"


def _read(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


class AcquirerProcess:
    """One ``python -m api.acquirer.host`` child. ``args`` are extra CLI flags (faults,
    ``--seed``, ``--slow-seconds``); ``store`` defaults to a file in a new temp folder."""

    def __init__(
        self,
        *,
        store: Path | None = None,
        log_path: Path | None = None,
        args: Sequence[str] = (),
        port: int | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        folder = Path(tempfile.mkdtemp(prefix="acquirer-")) if store is None else store.parent
        self.store = store or folder / "acquirer.sqlite3"
        self.log_path = log_path or folder / "acquirer.log"
        self.args = tuple(args)
        self._port_given = port is not None
        self.port = port or free_port()
        self.control_port = free_port()
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"iso8583://{LOCAL}:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "api.acquirer.host",
            "--port",
            str(self.port),
            "--store",
            str(self.store),
            "--control-port",
            str(self.control_port),
            *self.args,
        ]

    def launch(self) -> None:
        """Start the process without waiting for it."""
        self.store.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.command(),
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def start(self, *, timeout: float = 30.0) -> Self:
        """Launch and wait until ready. A port picked here (``free_port``) can be taken by
        another process before the host binds it (parallel test runs): then the host exits
        with "address already in use" and is launched again on new ports (a port given by
        the caller is kept: that failure is the caller's)."""
        for attempt in range(3):
            self.launch()
            try:
                self.wait_ready(timeout=timeout)
                self._port_given = True  # started: a restart keeps the port servers dial
                return self
            except RuntimeError as exc:
                if attempt == 2 or self.alive() or "address already in use" not in str(exc):
                    raise
            if not self._port_given:
                self.port = free_port()
            self.control_port = free_port()
        raise AssertionError("unreachable")

    def wait_ready(self, *, timeout: float = 30.0) -> None:
        """Until a sign-on is answered (or, started ``--down``, the control socket is)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"acquirer host exited:\n{self.log_tail()}")
            if sign_on(self.port, timeout=1.0) or ("--down" in self.args and self._controls()):
                return
            time.sleep(0.05)
        raise RuntimeError(f"acquirer host not ready after {timeout:.0f}s:\n{self.log_tail()}")

    def _controls(self) -> bool:
        try:
            self.control()
        except (OSError, ValueError):
            return False
        return True

    def control(self, **changes: Any) -> dict[str, Any]:
        """Read or change the faults (``down=True``, ``drop_answer=0.5``, …)."""
        return control(LOCAL, self.control_port, **changes)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, signum: int) -> None:
        os.kill(self.pid, signum)

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL: no shutdown, no flush — what is in the store was committed."""
        if self.alive():
            assert self.proc is not None
            stop_pid(self.proc.pid, sig=signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, *, timeout: float = 10.0) -> int | None:
        """SIGTERM, SIGKILL after ``timeout``; the exit code (None when killed)."""
        if self.proc is None:
            return None
        if self.alive():
            stop_pid(self.proc.pid)
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                return None
        return self.proc.returncode

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def stop_pid(pid: int, *, sig: int = signal.SIGTERM) -> None:
    """Signal the host (and its session) by PID; a host already gone is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def start_acquirer(
    *, store: Path | None = None, args: Sequence[str] = ()
) -> tuple[str, int, Path, subprocess.Popen[bytes]]:
    """Start a host; (url, control port, store path, Popen). Stop it with ``stop_pid``."""
    host = AcquirerProcess(store=store, args=args).start()
    assert host.proc is not None
    return host.url, host.control_port, host.store, host.proc
