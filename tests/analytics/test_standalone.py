"""The daily audit on a real Spark standalone cluster (``analytics.standalone``): a master
and two workers from pyspark's own launch classes on 127.0.0.1. One of the two workers is
SIGKILLed (with its executor) once it has done part of the job; the job still finishes,
and every CSV it writes is byte for byte the CSV of local mode on the same planted lake."""

from __future__ import annotations

import subprocess
import time
from datetime import date
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from analytics.jobs.daily_audit import OUTPUTS, run_audit
from analytics.standalone import AUDIT_JOB, StandaloneCluster, free_port, get_json
from analytics.synth import SynthConfig, synthesize
from tests.analytics.conftest import SHORT_LIVED_JVM

FIRST, LAST = date(2026, 11, 20), date(2026, 11, 21)
CSVS = [f"{name}.csv" for name in [*OUTPUTS, "lake_warnings"]]
VICTIM = 1


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lake")
    config = SynthConfig(
        lake=root, days=2, events_per_day=400, seed=5, start=FIRST, merchants=2, violations=1
    )
    result = synthesize(config)
    assert result.planted_double_charges and result.planted_violations == 1
    return root


def _victim_has_worked(cluster: StandaloneCluster, ui_port: int) -> int | None:
    """The number of finished jobs once the victim worker's executor has completed tasks
    and at least one job is done; None before."""
    apps = get_json(ui_port, "/api/v1/applications")
    if not apps:
        return None
    app = apps[0]["id"]
    ours = {str(e["id"]) for e in cluster.executors_on(VICTIM) if e["appid"] == app}
    executors = get_json(ui_port, f"/api/v1/applications/{app}/executors")
    worked = any(e["id"] in ours and e["completedTasks"] > 0 for e in executors)
    done = len(get_json(ui_port, f"/api/v1/applications/{app}/jobs?status=succeeded"))
    return done if worked and done else None


def _wait_for_work(cluster: StandaloneCluster, ui_port: int, driver: subprocess.Popen[str]) -> int:
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        assert driver.poll() is None, "the job ended before the worker could be killed"
        try:
            done = _victim_has_worked(cluster, ui_port)
        except (OSError, ValueError):  # the driver's UI is not up (or not answering JSON) yet
            done = None
        if done:
            return done
        time.sleep(0.2)
    raise TimeoutError("the victim worker never ran a task")


def test_audit_on_a_standalone_cluster_loses_a_worker_and_matches_local_mode(
    spark: SparkSession, lake: Path, tmp_path: Path
) -> None:
    local = tmp_path / "local"
    run_audit(spark, lake=str(lake), out=local, start=FIRST, end=LAST)

    out = tmp_path / "cluster"
    args = ["--from", str(FIRST), "--to", str(LAST), "--lake", str(lake), "--out", str(out)]
    log_path = tmp_path / "driver.log"
    with StandaloneCluster(tmp_path / "spark", workers=2) as cluster:
        assert cluster.state()["aliveworkers"] == 2
        ui_port = free_port(cluster.taken)
        conf = {
            "spark.ui.enabled": "true",
            "spark.ui.port": str(ui_port),
            "spark.driver.extraJavaOptions": SHORT_LIVED_JVM,
            "spark.executor.extraJavaOptions": SHORT_LIVED_JVM,
        }
        with log_path.open("w") as log:
            driver = cluster.submit(AUDIT_JOB, args, conf=conf, log=log)
            try:
                jobs_before_kill = _wait_for_work(cluster, ui_port, driver)
                cluster.kill_worker(VICTIM)
                still_running = driver.poll() is None
                returncode = driver.wait(timeout=300)
            finally:
                if driver.poll() is None:
                    driver.kill()
                    driver.wait()
        alive_after = cluster.state()["aliveworkers"]

    driver_log = log_path.read_text()
    assert returncode == 0, driver_log[-4000:]
    assert still_running and jobs_before_kill >= 1  # killed mid-job …
    assert "Lost executor" in driver_log  # … and the driver saw its executor go
    assert alive_after == 1
    for name in CSVS:
        assert (out / name).read_bytes() == (local / name).read_bytes(), name
    summary = (out / "daily_summary.csv").read_text().splitlines()
    assert len(summary) > 1 and f"{FIRST},ALL," in "\n".join(summary)
