"""``idempay migrate`` run by several processes at once, as replicas starting together do."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from tests.support.services import ROOT

# Each process imports everything first, then waits for the go file, so that the
# migrations really start together (imports alone would stagger them by seconds).
RACER = """
import os, sys, time
from api.config import Settings
from api.migrate import migrate
settings = Settings()
print("ready", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.001)
migrate(settings)
"""


def race_migrations(
    env: Mapping[str, str], count: int, go: Path, *, timeout: float
) -> tuple[list[int | None], list[str]]:
    """``count`` migrations with ``env`` released together (``go`` made once every one is
    at its start line); their exit codes and outputs."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, str(go)],
            cwd=ROOT,
            env=dict(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for _ in range(count)
    ]
    for proc in procs:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == b"ready"
    go.touch()  # every racer is at its start line
    outputs = [proc.communicate(timeout=timeout)[0].decode() for proc in procs]
    return [proc.returncode for proc in procs], outputs
