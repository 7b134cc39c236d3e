"""``idempay demo`` end to end, small: a fleet through the chaos proxy on the embedded
SQLite, six synthesized past days plus the fleet's day in the lake, the Spark audit over
the week, and the audit's link loss checked against the proxy's own count."""

from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pytest

from tests.support.services import ROOT

pytestmark = [pytest.mark.server, pytest.mark.spark]


def test_demo_shows_a_week_and_its_link_loss_agrees_with_the_proxy(tmp_path: Path) -> None:
    env = {**os.environ, "IDEMPAY_VAR_DIR": str(tmp_path / "var"), "COLUMNS": "400"}
    env.pop("IDEMPAY_DATABASE_URL", None)  # the embedded default
    env["IDEMPAY_REDIS_URL"] = ""
    workdir = tmp_path / "demo"
    argv = [sys.executable, "-m", "idempay_tools", "demo", "--workdir", str(workdir)]
    argv += ["--terminals", "3", "--payments", "30", "--loss", "0.1"]
    today = datetime.now(UTC).date()
    # Twice in a row: each run has a folder of its own (database, journals, lake, report),
    # so the second neither reads the first's keys nor touches what `idempay serve` uses.
    runs = []
    for _ in range(2):
        done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        out = done.stdout + done.stderr
        assert done.returncode == 0, out
        runs.append(re.search(r"this run's folder: (\S+)", out))
    first_run, second_run = (Path(m.group(1)) for m in runs if m is not None)
    assert first_run != second_run and first_run.is_dir()
    assert (workdir / "latest").resolve() == second_run.resolve()
    assert not (tmp_path / "var" / "idempay.db").exists()  # serve's embedded database
    assert re.search(r"time: \d+ s \(fleet \d+ s, lake \d+ s, audit \d+ s, checks \d+ s\)", out)
    workdir = workdir / "latest"

    # Seven days: six synthesized, then the fleet's (the day after, if the run crossed
    # midnight, as an eighth).
    with (workdir / "audit" / "daily_trend.csv").open(newline="") as handle:
        trend = list(csv.DictReader(handle))
    days = [date.fromisoformat(row["event_date"]) for row in trend]
    first = today - timedelta(days=6)
    assert days[:7] == [first + timedelta(days=n) for n in range(7)], days
    assert all(int(row["transactions"]) > 0 for row in trend[:7]), trend
    report = (workdir / "audit" / "report.html").resolve()
    assert f"finance report, {first} – {days[-1]}: {report}" in out
    html = report.read_text()
    assert all(day.isoformat() in html for day in days)

    link = re.search(
        r"proxy: lost before the server (\d+), forwarded (\d+) .*\n\s*"
        r"audit: unseen_attempts (\d+), received (\d+)",
        out,
    )
    assert link, out
    lost, forwarded, unseen, received = map(int, link.groups())
    assert lost >= 1 and (unseen, received) == (lost, forwarded), out
    assert "link loss: agree" in out
    # The acquirer host ran as a process of its own; its store agrees with the database.
    assert "acquirer host iso8583://127.0.0.1:" in out
    assert re.search(r"the acquirer agrees: \d+ 0200s for \d+ RRNs", out), out
    for name in ("acquirer_one_0200_per_key", "acquirer_advice_drained",
                 "acquirer_net_approvals", "acquirer_timeout_advised"):  # fmt: skip
        assert re.search(rf"invariant {name}\s*\W+\s*ok", out), name
    assert (workdir / "terminals" / "acquirer" / "acquirer.sqlite3").is_file()
