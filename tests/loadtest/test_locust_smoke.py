"""Smoke test of loadtest/locustfile.py: each scenario runs ~5 s headless against a real
server on loopback and must exit 0, make requests, and fail none (correctness only: the
p99 threshold is set out of reach)."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.backend import Backend

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ("LossyTerminal", "SdkTerminal", "DuplicateStorm", "InDoubtStorm")


@dataclass(frozen=True)
class Run:
    returncode: int
    output: str
    stats: dict[str, dict[str, str]]


def _stats(prefix: Path) -> dict[str, dict[str, str]]:
    path = Path(f"{prefix}_stats.csv")
    if not path.exists():
        return {}
    with path.open(newline="") as handle:
        return {f"{row['Type']} {row['Name']}".strip(): row for row in csv.DictReader(handle)}


@pytest.fixture(scope="module")
def runs(pg_backend: Backend, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Run]]:
    """All four scenarios at once (each its own Locust process), to keep the test short."""
    server = pg_backend.server()
    tmp = tmp_path_factory.mktemp("locust")
    env = {
        **os.environ,
        "IDEMPAY_API_KEY": pg_backend.api_key("merchant-locust"),
        "IDEMPAY_LT_MAX_P99_MS": "1000000",
        "IDEMPAY_LT_LOSS": "0.2",  # exercise the lost-response path in 5 s
    }
    procs = {}
    for name in SCENARIOS:
        command = [
            sys.executable, "-m", "locust", "-f", "loadtest/locustfile.py", "--headless",
            "-u", "5", "-r", "5", "--run-time", "5s", "--stop-timeout", "10",
            "--host", server.url, "--csv", str(tmp / name), "--only-summary", name,
        ]  # fmt: skip
        procs[name] = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
    results = {}
    try:
        for name, proc in procs.items():
            output, _ = proc.communicate(timeout=60)
            results[name] = Run(proc.returncode, output, _stats(tmp / name))
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    yield results
    server.stop()


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenario_runs_clean(runs: dict[str, Run], scenario: str) -> None:
    run = runs[scenario]
    assert run.returncode == 0, run.output[-3000:]
    total = run.stats.get("Aggregated")
    assert total is not None, run.output[-3000:]
    assert int(total["Request Count"]) > 0, run.output[-3000:]
    assert int(total["Failure Count"]) == 0, run.output[-3000:]


def test_payments_are_reported(runs: dict[str, Run]) -> None:
    """The terminal scenarios report each payment as one PAY event."""
    assert int(runs["LossyTerminal"].stats["PAY lossy payment"]["Request Count"]) > 0
    assert int(runs["SdkTerminal"].stats["PAY SDK purchase"]["Request Count"]) > 0
