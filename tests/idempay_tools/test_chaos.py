"""The ``make test`` variant of ``make chaos``: a 90-second run with every fault kind once
(an API worker SIGKILLed, a terminal SIGKILLed and recovered, PostgreSQL crashed and
restarted, Redis killed and restarted, a 30 % loss burst, a terminal's journal disk full, a
database restore with Redis kept, a rolling SIGTERM restart, a noisy neighbour; clocks
behind and ahead). It fails when any contract §8 invariant, the ledger balance, a recovery or
the lake's request-event check does not hold."""

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
        [sys.executable, "-m", "idempay_tools.chaos", "--duration", "90", "--seed", "11",
         "--terminals", "6", "--report", str(report)],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    assert "chaos: PASSED" in done.stdout
    text = report.read_text()
    assert "every invariant held" in text
    for fault in ("API worker SIGKILLed", "terminal SIGKILLed", "PostgreSQL crash",
                  "Redis SIGKILL", "network loss burst", "clock skew", "journal disk full",
                  "database restored", "rolling restart", "noisy neighbour"):  # fmt: skip
        assert fault in text, fault
    section = text.split("## Invariants", 1)[1].split("## Ledger", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("| ")]
    cells = [line.strip("| ").split(" | ") for line in lines]
    violations = {name: count for name, count in cells[2:]}  # after the header + separator
    for check in ("lost payments", "duplicates (keys charged twice)",
                  "event ids twice in the lake", "answered probe creates never logged",
                  "payments refused on a clock-skewed terminal"):  # fmt: skip
        assert check in violations, check
    assert len(violations) >= 30 and set(violations.values()) == {"0"}, violations
