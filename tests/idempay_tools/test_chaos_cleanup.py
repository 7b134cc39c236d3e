"""A chaos run that is killed mid-run leaves nothing behind (issue 22): no private
PostgreSQL, Redis, API, sidecar, export or terminal process, and no run folder under
/tmp/idempay-chaos-*.

- SIGTERM (what a test runner or an operator sends): the harness stops everything it
  started, by PID, removes its folder and exits 128 + 15.
- SIGKILL (what ``subprocess.run(timeout=…)`` does to its child, e.g. when pytest-timeout
  interrupts a test that runs the harness that way): the harness cannot clean up; the
  reaper it started (``idempay_tools._chaos_reaper``) does.

"Left behind" is read from /proc: any process whose command line or environment names the
run's folder (the API and its workers, the sidecars and exports carry it in
``IDEMPAY_VAR_DIR``; PostgreSQL, Redis and the terminals in their arguments), and every PID
the run registered.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from idempay_tools._chaos_reaper import Registry, postmaster_pid

ROOT = Path(__file__).resolve().parents[2]
STARTED = re.compile(r"in (/\S+idempay-chaos-\w+); pid (\d+)")


def _mentioning(folder: Path) -> list[str]:
    """Processes (other than zombies) whose command line or environment names ``folder``."""
    needle = str(folder).encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            cmdline = (proc / "cmdline").read_bytes()
            environ = (proc / "environ").read_bytes()
        except (OSError, IndexError):
            continue
        if needle in cmdline or needle in environ:
            words = cmdline.replace(b"\0", b" ").decode(errors="replace")
            found.append(f"{proc.name}: {words}")
    return found


def _start_and_wait_for_fleet(
    tmp_path: Path, *, settle_s: float = 6.0
) -> tuple[subprocess.Popen[str], Path, list[str]]:
    """Start a harness; return once its fleet has sold for ``settle_s`` (its process, its
    folder, what it said so far)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "idempay_tools.chaos", "--duration", "60", "--seed", "3",
         "--terminals", "3", "--report", str(tmp_path / "never.md")],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    said: list[str] = []
    folder: Path | None = None
    deadline = time.monotonic() + 240
    assert proc.stdout is not None
    try:
        for line in proc.stdout:  # not through a generator: closing it would close the pipe
            said.append(line)
            if folder is None and (match := STARTED.search(line)):
                folder = Path(match.group(1))
            if "] fleet (budget" in line:
                break
            assert time.monotonic() < deadline, "".join(said)
        else:
            pytest.fail("the harness ended before its fleet started:\n" + "".join(said))
        assert folder is not None, "".join(said)
        time.sleep(settle_s)
    except BaseException:
        proc.kill()
        raise
    return proc, folder, said


def _running(folder: Path) -> tuple[list[int], int | None]:
    registry = Registry(folder)
    return [t.pid for t in registry.running()], postmaster_pid(folder)


def _wait_gone(folder: Path, seconds: float) -> list[str]:
    deadline = time.monotonic() + seconds
    while True:
        left = _mentioning(folder)
        if not left and not folder.exists():
            return []
        if time.monotonic() > deadline:
            return left + ([f"{folder} still exists"] if folder.exists() else [])
        time.sleep(0.5)


@pytest.mark.slow
def test_sigterm_mid_run_stops_every_process_and_removes_the_folder(tmp_path: Path) -> None:
    proc, folder, said = _start_and_wait_for_fleet(tmp_path)
    pids, postmaster = _running(folder)
    assert postmaster is not None and len(pids) >= 7, (pids, "".join(said))  # pg, redis, ...
    assert _mentioning(folder), "the run's processes should name its folder"
    proc.send_signal(signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("the harness did not exit within 90 s of SIGTERM")
    output = "".join(said) + out
    assert proc.returncode == 128 + signal.SIGTERM, output[-4000:]
    assert "interrupted by SIGTERM" in output
    assert "cleanup took" in output, output[-4000:]
    assert _wait_gone(folder, 5) == [], output[-4000:]
    assert not (tmp_path / "never.md").exists()


@pytest.mark.slow
def test_sigkill_of_the_harness_leaves_nothing_either(tmp_path: Path) -> None:
    proc, folder, _ = _start_and_wait_for_fleet(tmp_path, settle_s=3.0)
    assert _running(folder)[1] is not None
    proc.kill()  # no handler runs: the reaper has to do it
    proc.communicate(timeout=30)
    assert _wait_gone(folder, 60) == []
