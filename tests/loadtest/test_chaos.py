"""The ``make test`` variant of ``make chaos``: a one-minute run with every fault kind once
(an API worker SIGKILLed, a terminal SIGKILLed and recovered, PostgreSQL crashed and
restarted, Redis killed and restarted, a 30 % loss burst, one terminal's clock skewed).
It fails when any SPEC §8 invariant, the ledger balance or a recovery does not hold."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_a_short_chaos_run_keeps_every_invariant(tmp_path: Path) -> None:
    report = tmp_path / "reliability.md"
    done = subprocess.run(
        [sys.executable, "-m", "loadtest.chaos", "--duration", "60", "--seed", "11",
         "--terminals", "6", "--report", str(report)],
        cwd=ROOT, capture_output=True, text=True, timeout=540, check=False,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    assert "chaos: PASSED" in done.stdout
    text = report.read_text()
    assert "every invariant held" in text
    for fault in ("API worker SIGKILLed", "terminal SIGKILLed", "PostgreSQL crash",
                  "Redis SIGKILL", "network loss burst", "clock skew"):  # fmt: skip
        assert fault in text, fault
    section = text.split("## Invariants", 1)[1].split("## Ledger", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("| ")]
    cells = [line.strip("| ").split(" | ") for line in lines]
    violations = {name: count for name, count in cells[2:]}  # after the header + separator
    assert "lost payments" in violations and "duplicates (keys charged twice)" in violations
    assert len(violations) >= 15 and set(violations.values()) == {"0"}, violations
