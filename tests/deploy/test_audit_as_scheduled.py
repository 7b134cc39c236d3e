"""The daily-audit CronJob's two steps run here as scheduled: its own scripts and
environment, read from the manifest. The export step runs against the migrated private
database; the Spark step runs the job file unchanged under the real spark-submit, with
the CronJob's arguments, on a small synthesized lake. Only these change: the Spark master
(local[2] instead of the cluster), the driver's address (127.0.0.1), the lake and output
directories, and which python the driver uses (this venv's, as the image's PYSPARK_PYTHON)."""

from __future__ import annotations

import csv
import subprocess
import sys
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

from analytics.synth import SynthConfig, synthesize
from tests.deploy.manifests import (
    ROOT,
    clean_environ,
    container,
    container_env,
    find,
    k8s_argv,
    render_base,
    render_local,
)
from tests.deploy.running import image_env, overrides, run_to_the_end

SUMMARY_HEAD = ["event_date", "merchant_id", "transactions", "create_requests"]


def _cronjob(docs: list[dict[str, Any]], name: str) -> tuple[list[str], dict[str, str]]:
    cron = find(docs, "CronJob", "idempay-daily-audit")
    spec = container(cron, name)
    return k8s_argv(spec, []), container_env(docs, cron, spec)


def _yesterdays() -> set[date]:
    return {(datetime.now(UTC) - timedelta(days=n)).date() for n in (0, 1)}


def test_export_step_writes_yesterday_to_the_lake(
    deployed_db: str, redis_prefix: str, tmp_path: Path
) -> None:
    argv, env = _cronjob(render_local(), "export")
    assert argv[:2] == ["/bin/sh", "-c"]
    lake = tmp_path / "lake"
    run_env = {
        **clean_environ(),
        **image_env(),
        **env,
        **overrides(deployed_db, redis_prefix),
        "LAKE_DIR": str(lake),
    }
    stdout = run_to_the_end(argv, run_env, tmp_path)
    days = {path.name for path in (lake / "request_events").iterdir()}
    assert len(days) == 1 and days <= {f"event_date={d}" for d in _yesterdays()}
    for table in ("request_events", "transactions", "ledger_entries"):
        assert list((lake / table).glob("event_date=*/*.parquet")), table
        assert f"{table}: 0 rows" in stdout


def test_spark_step_runs_the_job_unchanged_under_spark_submit(tmp_path: Path) -> None:
    argv, env = _cronjob(render_base(), "audit")
    assert argv[:4] == ["/usr/bin/tini", "--", "/bin/sh", "-c"]
    assert env["SPARK_MASTER"] == "k8s://https://kubernetes.default.svc"
    today = datetime.now(UTC).date()
    lake, out = tmp_path / "lake", tmp_path / "audit"
    synthesize(
        SynthConfig(
            lake=lake,
            days=3,
            events_per_day=400,
            seed=11,
            start=today - timedelta(days=2),
            merchants=2,
            terminals_per_merchant=5,
        )
    )
    run_env = {
        **clean_environ(),
        **env,
        "SPARK_MASTER": "local[2]",
        "POD_IP": "127.0.0.1",
        "SPARK_DRIVER_BIND_ADDRESS": "127.0.0.1",
        "SPARK_LOCAL_IP": "127.0.0.1",
        "LAKE_DIR": str(lake),
        "AUDIT_OUT_DIR": str(out),
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PATH": f"{Path(sys.executable).parent}:{clean_environ()['PATH']}",
    }
    # tini is PID 1 in the pod; here the shell runs the same script directly. The image's
    # WORKDIR /opt/idempay holds analytics/ as the repository root does.
    result = subprocess.run(
        argv[2:], env=run_env, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False
    )
    assert result.returncode == 0, result.stderr[-4000:]
    (day_dir,) = out.iterdir()
    assert date.fromisoformat(day_dir.name) in _yesterdays()
    with (day_dir / "daily_summary.csv").open(newline="") as handle:
        reader = csv.DictReader(handle)
        assert reader.fieldnames and reader.fieldnames[:4] == SUMMARY_HEAD
        rows = list(reader)
    assert {row["event_date"] for row in rows} == {day_dir.name}
    fleet = [row for row in rows if row["merchant_id"] == "ALL"]
    assert len(fleet) == 1 and int(fleet[0]["transactions"]) > 0
    assert (day_dir / "report.html").is_file()
    assert f"report: {day_dir / 'report.html'}" in result.stdout
