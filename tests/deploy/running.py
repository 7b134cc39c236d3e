"""Running deploy/'s commands on this machine the way a container runs them: the image's
ENV, the container's environment, an empty working directory, and only the database and
Redis locations changed."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

from tests.deploy.manifests import DEPLOY, VENV_BIN, dockerfile_stages

SHARED_REDIS = "redis://127.0.0.1:6379/0"
# What an operator exports before `docker compose up` (compose refuses to start without).
COMPOSE_ENV = {"POSTGRES_PASSWORD": "compose-test-password", "IDEMPAY_SECRET_KEY": "k" * 48}


def image_env(dockerfile: str = "Dockerfile") -> dict[str, str]:
    """The runtime stage's ENV, with PATH pointing at this venv as it points at /opt/venv."""
    env = dockerfile_stages(DEPLOY / dockerfile)[-1].env()
    env["PATH"] = f"{VENV_BIN}:{os.environ['PATH']}"
    return env


def overrides(database_url: str, redis_prefix: str) -> dict[str, str]:
    """The only settings a test changes: where the database and Redis are, and a Redis key
    prefix private to this run."""
    return {
        "IDEMPAY_DATABASE_URL": database_url,
        "IDEMPAY_REDIS_URL": SHARED_REDIS,
        "IDEMPAY_REDIS_PREFIX": redis_prefix,
    }


def empty_workdir(tmp_path: Path) -> Path:
    """An empty working directory, like the image's WORKDIR /app (no source tree there)."""
    path = tmp_path / "app"
    path.mkdir(exist_ok=True)
    return path


def run_to_the_end(argv: list[str], env: Mapping[str, str], tmp: Path) -> str:
    """``argv`` run in ``tmp``'s empty working directory with ``env`` only, as a container
    runs a command; it must exit 0 within 120 s. Its standard output."""
    result = subprocess.run(
        argv,
        env=dict(env),
        cwd=empty_workdir(tmp),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout
