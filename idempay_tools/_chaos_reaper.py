"""Every process a chaos run starts, by PID, so that nothing outlives the run (issue 22).

``Registry``: the run's folder holds ``.pids``, one line per process the harness started —
``PID START_TIME GROUP LABEL`` (the start time from ``/proc/PID/stat``, so that a PID the
kernel has since given to another process is never signalled; GROUP 1 when the process
leads its own process group, which is then signalled whole). The private PostgreSQL is
found by its ``postmaster.pid`` (``pg_ctl`` detaches the postmaster from the harness).

``sweep(root)`` stops whatever of that is still running: SIGTERM, then SIGKILL after
``grace_s``; the postmaster SIGQUIT (immediate shutdown), then SIGKILL; then every file
system mounted under the run's folder is unmounted (``unmount_under``: the SQLite
disk-full episode's loop disk — a mount left there would keep the folder from being
removed, and its loop device attached). The harness calls it last in its own cleanup
(after stopping each process in order).

``python -m idempay_tools._chaos_reaper PARENT_PID ROOT``: the harness starts this watcher
in a session of its own; it waits for the harness to exit and, if the harness did not say
it cleaned up (``ROOT/.clean``), sweeps and removes ``ROOT`` (kept when ``ROOT/.keep``
exists) — so a harness that is SIGKILLed (``subprocess.run(timeout=…)`` kills its child so)
or dies any other way leaks no PostgreSQL, Redis, server or terminal.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "CLEAN",
    "KEEP",
    "Registry",
    "Tracked",
    "mounts_under",
    "postmaster_pid",
    "start_time",
    "sweep",
    "unmount_under",
]

REGISTRY = ".pids"
CLEAN = ".clean"
KEEP = ".keep"


def start_time(pid: int) -> str | None:
    """The process's start time (clock ticks since boot), or None when it does not exist."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    if fields and fields[0] == "Z":  # a zombie has exited; only its parent's wait is missing
        return None
    return fields[19] if len(fields) > 19 else None


@dataclass(frozen=True)
class Tracked:
    pid: int
    started: str
    group: bool
    label: str

    def alive(self) -> bool:
        return start_time(self.pid) == self.started

    def signal(self, signum: int) -> None:
        if not self.alive():
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if self.group:
                os.killpg(self.pid, signum)
            else:
                os.kill(self.pid, signum)


class Registry:
    """The run's ``.pids`` file (append-only, thread-safe)."""

    def __init__(self, root: Path) -> None:
        self.path = root / REGISTRY
        self._lock = threading.Lock()

    def add(self, pid: int, label: str, *, group: bool = False) -> None:
        started = start_time(pid)
        if started is None:
            return
        with self._lock, self.path.open("a") as out:
            out.write(f"{pid} {started} {int(group)} {label}\n")

    def tracked(self) -> list[Tracked]:
        try:
            lines = self.path.read_text().splitlines()
        except OSError:
            return []
        found = []
        for line in lines:
            parts = line.split(" ", 3)
            if len(parts) == 4 and parts[0].isdigit():
                found.append(Tracked(int(parts[0]), parts[1], parts[2] == "1", parts[3]))
        return found

    def running(self) -> list[Tracked]:
        return [t for t in self.tracked() if t.alive()]


def postmaster_pid(root: Path) -> int | None:
    """The private PostgreSQL's postmaster, from ``ROOT/pg/data/postmaster.pid``."""
    try:
        first = (root / "pg" / "data" / "postmaster.pid").read_text().split("\n", 1)[0]
    except OSError:
        return None
    pid = int(first) if first.strip().isdigit() else None
    return pid if pid is not None and start_time(pid) is not None else None


def mounts_under(root: Path) -> list[Path]:
    """Mount points inside ``root`` (deepest first), from ``/proc/self/mountinfo``."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    inside = str(root.resolve()).rstrip("/") + "/"
    found = []
    for line in lines:
        fields = line.split(" ")
        if len(fields) < 5:
            continue
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
        if point.startswith(inside):
            found.append(Path(point))
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def unmount_under(root: Path) -> list[str]:
    """Unmount every file system mounted inside ``root`` (lazily when still busy); what
    was unmounted. Called once the run's processes are stopped."""
    done = []
    for point in mounts_under(root):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            plain = subprocess.run(["umount", str(point)], capture_output=True, timeout=20)
            if plain.returncode != 0:
                subprocess.run(["umount", "-l", str(point)], capture_output=True, timeout=20)
            done.append(f"mount {point}")
    return done


def sweep(root: Path, *, grace_s: float = 5.0) -> list[str]:
    """Stop every registered process still running and the postmaster, then unmount what
    is mounted inside ``root``; what it stopped and unmounted."""
    running = Registry(root).running()
    postmaster = postmaster_pid(root)
    stopped = [f"{t.label} (pid {t.pid})" for t in running]
    if postmaster is not None:
        stopped.append(f"postgres (pid {postmaster})")
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(postmaster, signal.SIGQUIT)
    for tracked in running:
        tracked.signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not any(t.alive() for t in running) and (
            postmaster is None or start_time(postmaster) is None
        ):
            break
        time.sleep(0.1)
    else:
        for tracked in running:
            tracked.signal(signal.SIGKILL)
        if postmaster is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(postmaster, signal.SIGKILL)
    return stopped + unmount_under(root)


def _watch(parent: int, root: Path) -> int:
    born = start_time(parent)
    if born is None:
        return 0
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the harness's to handle
    while start_time(parent) == born:
        time.sleep(0.5)
    if not root.exists() or (root / CLEAN).exists():
        return 0
    sweep(root)
    if not (root / KEEP).exists():
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(_watch(int(sys.argv[1]), Path(sys.argv[2])))
