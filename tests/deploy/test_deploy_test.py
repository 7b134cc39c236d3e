"""`make deploy-test` (deploy/local/deploy_test.sh, scripts/dockerd.sh), checked without a
Docker engine: it is the last step of `make test`; where it cannot run it says so in one line
and does not pass as if it had run; and the images it builds are the ones compose and the
Kubernetes overlay name and the ones it removes. The run itself is `make deploy-test`."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import yaml

from tests.deploy import kustomize
from tests.deploy.manifests import (
    DEPLOY,
    ROOT,
    compose_raw,
    idempay_cli,
    parse_idempay,
    render_local,
)

LOCAL = DEPLOY / "local"
DEPLOY_TEST = LOCAL / "deploy_test.sh"
DOCKERD = ROOT / "scripts" / "dockerd.sh"


def _recipe(target: str) -> list[str]:
    lines = (ROOT / "Makefile").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{target}:"))
    recipe = []
    for line in lines[start + 1 :]:
        if not line.startswith("\t"):
            break
        recipe.append(line.strip())
    return recipe


def _built_images() -> set[str]:
    script = (LOCAL / "build_images.sh").read_text()
    tag = re.search(r'tag="\$\{IDEMPAY_TAG:-(\w+)\}"', script)
    assert tag
    names = re.findall(r'^build "([^"]+)"', script, flags=re.M)
    return {name.replace("$tag", tag.group(1)) for name in names}


def test_make_test_ends_with_the_deploy_test_where_it_can_run() -> None:
    recipe = _recipe("test")
    assert recipe[-1] == "./deploy/local/deploy_test.sh --if-possible"
    assert any(line.startswith("$(BIN)/pytest") for line in recipe[:-1])
    assert _recipe("deploy-test") == ["./deploy/local/deploy_test.sh"]


def test_scripts_parse() -> None:
    for script in [DEPLOY_TEST, DOCKERD, *LOCAL.glob("*.sh")]:
        assert os.access(script, os.X_OK), script
        subprocess.run(["bash", "-n", str(script)], check=True)


def _readable_copy(script: Path, into: Path) -> Path:
    """deploy_test.sh and scripts/dockerd.sh copied to ``into`` as they lie in the checkout
    (deploy_test.sh finds dockerd.sh by its own path), every folder 0755 and file 0755: the
    checkout may live where another user cannot enter (a clone under a 0700 folder)."""
    for path in (DEPLOY_TEST, DOCKERD):
        copy = into / path.relative_to(ROOT)
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, copy)
        copy.chmod(0o755)
    for folder in [into, *(p for p in into.rglob("*") if p.is_dir())]:
        folder.chmod(0o755)
    blocked = [p for p in into.parents if not p.stat().st_mode & 0o001]
    assert not blocked, f"{into}: other users cannot enter {blocked} (TMPDIR)"
    return into / script.relative_to(ROOT)


def _as_nobody(script: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Runs a copy of ``script`` as a user that is not root (the case `make test` must
    report, not pass), from a temporary folder that user can read."""
    with tempfile.TemporaryDirectory(prefix="idempay-as-nobody-") as into:
        return _run_as_nobody(str(_readable_copy(script, Path(into))), *args)


def _run_as_nobody(*argv: str) -> subprocess.CompletedProcess[str]:
    prefix: list[str] = []
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        assert setpriv, "util-linux's setpriv (Debian: essential)"
        prefix = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/nonexistent"}
    return subprocess.run(
        [*prefix, *argv], capture_output=True, text=True, env=env, cwd="/", check=False
    )


def test_where_it_cannot_run_make_test_says_why_in_one_line() -> None:
    result = _as_nobody(DEPLOY_TEST, "--if-possible")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "deploy-test: NOT RUN on this machine: not root (dockerd and debootstrap need root)"
    ]


def test_where_it_cannot_run_make_deploy_test_fails() -> None:
    result = _as_nobody(DEPLOY_TEST)
    assert result.returncode == 1
    assert "deploy-test: cannot run here: not root" in result.stderr
    check = _as_nobody(DOCKERD, "check")
    assert check.returncode == 1
    assert check.stdout.strip() == "not root (dockerd and debootstrap need root)"


def test_the_private_engine_is_private() -> None:
    script = DOCKERD.read_text()
    for flag in ["--data-root", "--exec-root", "--pidfile", "--config-file", "--host"]:
        assert flag in script
    assert "/var/lib/docker" not in script and "/var/run/docker.sock" not in script
    assert "--iptables=false" in script and "--ip-forward=false" in script
    assert "native.cgroupdriver=cgroupfs" in script
    # Stopped by its own PID, never by a name.
    assert not re.search(r"\b(pkill|killall)\b", script)
    deploy_test = DEPLOY_TEST.read_text()
    assert "trap cleanup EXIT" in deploy_test and "purge" in deploy_test
    assert "DEPLOY_CHECK_RMI=1" in deploy_test


def test_the_images_built_are_the_ones_compose_and_the_local_overlay_use() -> None:
    built = _built_images()
    assert built == {
        "idempay:local",
        "idempay-spark:local",
        "idempay/postgres:15-local",
        "idempay/redis:7-local",
        "idempay/nginx:local",
    }
    # compose.yaml's own images (its defaults) and the three compose.local.yaml swaps in.
    services = compose_raw()["services"]
    defaults = {
        m.group(1)
        for service in services.values()
        if (m := re.fullmatch(r"\$\{IDEMPAY_(?:\w+_)?IMAGE:-([^}]+)\}", service.get("image", "")))
    }
    assert defaults == {"idempay:local", "idempay-spark:local"}
    local = yaml.safe_load((LOCAL / "compose.local.yaml").read_text())["services"]
    swapped = {re.sub(r"\$\{\w+:-([^}]+)\}", r"\1", s["image"]) for s in local.values()}
    assert defaults | swapped == built
    # The Kubernetes local overlay runs the same two application images, Spark executors too.
    overlay = {
        spec["image"]
        for doc in render_local()
        for spec in kustomize.containers(doc)
        if spec["image"].startswith("idempay")
    }
    assert overlay == defaults
    audit = next(
        d for d in render_local() if d["kind"] == "ConfigMap" and "SPARK_IMAGE" in d.get("data", {})
    )
    assert audit["data"]["SPARK_IMAGE"] == "idempay-spark:local"


def test_deploy_check_removes_every_image_it_built() -> None:
    script = (LOCAL / "deploy_check.sh").read_text()
    removal = re.search(r"docker image rm ((?:[^\n]|\\\n)+?) >/dev/null", script)
    assert removal
    assert set(removal.group(1).replace("\\\n", " ").split()) == _built_images()


def test_base_root_file_systems_are_cached_outside_the_repository() -> None:
    script = (LOCAL / "build_base.sh").read_text()
    cache = re.search(r'cache="\$\{IDEMPAY_DEBOOTSTRAP_CACHE:-([^}]+)\}"', script)
    assert cache and not Path(cache.group(1)).is_relative_to(ROOT)


def test_deploy_check_runs_the_acquirer_checks_on_the_acquirer_sims_store() -> None:
    """The fleet's §8 checks include the acquirer's: deploy_check.sh hands `idempay simulate`
    the acquirer-sim's store, read from its compose volume, checks that each acquirer-side
    invariant was reported, or says in a line why it could not read the store."""
    from idempay_tools.invariants import ACQUIRER_INVARIANTS

    script = (LOCAL / "deploy_check.sh").read_text()
    service = compose_raw()["services"]["acquirer-sim"]
    (mount,) = service["volumes"]
    volume, folder = mount.split(":")
    store = service["command"][service["command"].index("--store") + 1]
    assert store.startswith(f"{folder}/")
    name = store.removeprefix(f"{folder}/")
    assert f'"${{IDEMPAY_PROJECT}}_{volume}"' in script
    assert f'acquirer_store=(--acquirer-store "$volume/{name}")' in script
    assert '"${acquirer_store[@]}"' in script
    assert "acquirer checks: SKIPPED:" in script
    simulate = next(c for c in idempay_cli().commands.values() if c.name == "simulate")
    assert "--acquirer-store" in {o for p in simulate.params for o in p.opts}
    listed = re.search(r"for invariant in ((?:[^\n;]|\\\n)+);", script)
    assert listed and tuple(listed.group(1).replace("\\\n", " ").split()) == ACQUIRER_INVARIANTS
    # the acquirer-sim healthy, and the replicas on it rather than on a child host of their own
    assert "{{.State.Health.Status}}" in script and "compose ps -q acquirer-sim" in script
    assert '"acquirer iso8583://acquirer-sim:8583, workers"' in script
    clearing = re.search(
        r"compose exec -T acquirer-sim (idempay acquirer clearing (?:[^\n]|\\\n)*?) >", script
    )
    assert clearing
    argv = clearing.group(1).replace("\\\n", " ").replace('"$day"', "2026-11-20").split()
    command, params = parse_idempay(argv)
    assert command == "acquirer clearing" and str(params["store"]) == store
