"""Reading deploy/ the way Docker, compose and Kubernetes read it: Dockerfile instructions,
compose interpolation, a container's command line and environment, and `idempay` argument
lists parsed by the real CLI."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import typer.main
import yaml

from api.config import Settings
from idempay_tools.cli import app
from tests.deploy import kustomize

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
LOCAL_OVERLAY = K8S / "overlays" / "local"
VENV_BIN = Path(sys.executable).parent
SETTINGS_ENV = {f"IDEMPAY_{name.upper()}" for name in Settings.model_fields}
# Values a pod gets from the downward API, for running a container's command here.
FIELD_REFS = {"status.podIP": "127.0.0.1", "metadata.name": "audit-test", "metadata.namespace": "t"}


# --- Dockerfile ----------------------------------------------------------------------------
@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]

    def last(self, keyword: str) -> str | None:
        found = self.all(keyword)
        return found[-1] if found else None

    def exec_form(self, keyword: str) -> list[str]:
        value = self.last(keyword)
        assert value is not None, f"{keyword} missing"
        parsed = json.loads(value)
        assert isinstance(parsed, list), f"{keyword} must use the exec (JSON) form"
        return [str(item) for item in parsed]

    def env(self) -> dict[str, str]:
        values: dict[str, str] = {}
        for args in self.all("ENV"):
            for token in shlex.split(args):
                name, _, value = token.partition("=")
                values[name] = value
        return values


def dockerfile_stages(path: Path) -> list[Stage]:
    """Stages in order, each with its (keyword, arguments) list; continuations joined."""
    text = re.sub(r"\\\n", " ", path.read_text())
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, rest = line.partition(" ")
        keyword, rest = keyword.upper(), rest.strip()
        if keyword == "ARG" and not stages:
            name, _, default = rest.partition("=")
            args[name] = default
        elif keyword == "FROM":
            parts = rest.split()
            base = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], parts[0])
            stage = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else None
            stages.append(Stage(base=base, name=stage))
        else:
            stages[-1].instructions.append((keyword, rest))
    return stages


# --- compose -------------------------------------------------------------------------------
_INTERPOLATION = re.compile(
    r"\$(?:\$|\{(?P<name>\w+)(?:(?P<op>:[-?])(?P<arg>[^}]*))?\}|(?P<bare>\w+))"
)


class MissingVariable(AssertionError):
    """A ${VAR:?message} had no value: compose refuses to start."""


def interpolate(value: str, env: Mapping[str, str]) -> str:
    """Compose's interpolation: ${VAR}, ${VAR:-default}, ${VAR:?error}, $$ → $."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group("name") or match.group("bare")
        current = env.get(name, "")
        if match.group("op") == ":?" and not current:
            raise MissingVariable(f"{name}: {match.group('arg')}")
        if match.group("op") == ":-" and not current:
            return str(match.group("arg"))
        return current

    return _INTERPOLATION.sub(replace, value)


def interpolate_all(node: Any, env: Mapping[str, str]) -> Any:
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, list):
        return [interpolate_all(item, env) for item in node]
    if isinstance(node, dict):
        return {key: interpolate_all(item, env) for key, item in node.items()}
    return node


def compose_raw() -> dict[str, Any]:
    """deploy/compose.yaml as YAML (anchors and merge keys resolved), not interpolated."""
    return dict(yaml.safe_load((DEPLOY / "compose.yaml").read_text()))


def compose(env: Mapping[str, str]) -> dict[str, Any]:
    return dict(interpolate_all(compose_raw(), env))


def compose_argv(service: dict[str, Any], image_entrypoint: Sequence[str]) -> list[str]:
    entrypoint = service.get("entrypoint", list(image_entrypoint))
    return [*entrypoint, *service.get("command", [])]


# --- Kubernetes ----------------------------------------------------------------------------
def render_base() -> list[dict[str, Any]]:
    return kustomize.render(K8S / "base")


def render_local() -> list[dict[str, Any]]:
    """The local overlay, reading the committed example in place of the gitignored file."""
    example = LOCAL_OVERLAY / "secret.env.example"
    return kustomize.render(LOCAL_OVERLAY, env_files={"secret.env": example})


def find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    matches = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind}/{name}: {len(matches)} objects"
    return matches[0]


def container(doc: dict[str, Any], name: str) -> dict[str, Any]:
    matches = [c for c in kustomize.containers(doc) if c["name"] == name]
    assert len(matches) == 1, f"{doc['metadata']['name']} has no container {name}"
    return matches[0]


def container_env(
    docs: list[dict[str, Any]],
    doc: dict[str, Any],
    spec: dict[str, Any],
    *,
    external: Mapping[str, Mapping[str, str]] | None = None,
) -> dict[str, str]:
    """The environment Kubernetes gives ``spec``: envFrom first, then env (env wins).
    ``external`` supplies Secrets that are not rendered (the base expects them to exist)."""
    namespace = doc["metadata"].get("namespace")
    docs = docs + [
        {"kind": "Secret", "metadata": {"name": name, "namespace": namespace}, "data": data}
        for name, data in (external or {}).items()
    ]
    values: dict[str, str] = {}
    for source in spec.get("envFrom", []):
        ((kind_key, ref),) = source.items()
        kind = {"configMapRef": "ConfigMap", "secretRef": "Secret"}[kind_key]
        values.update(_object_data(docs, kind, ref["name"], namespace))
    for var in spec.get("env", []):
        if "value" in var:
            values[var["name"]] = str(var["value"])
            continue
        source = var["valueFrom"]
        if "fieldRef" in source:
            values[var["name"]] = FIELD_REFS[source["fieldRef"]["fieldPath"]]
        else:
            ((kind_key, ref),) = source.items()
            kind = {"configMapKeyRef": "ConfigMap", "secretKeyRef": "Secret"}[kind_key]
            values[var["name"]] = _object_data(docs, kind, ref["name"], namespace)[ref["key"]]
    return values


def _object_data(
    docs: list[dict[str, Any]], kind: str, name: str, namespace: str | None
) -> dict[str, str]:
    for doc in docs:
        meta = doc["metadata"]
        if doc["kind"] == kind and meta["name"] == name and meta.get("namespace") == namespace:
            return dict(doc.get("data", {}))
    raise AssertionError(f"{kind}/{name} referenced but not rendered")


def k8s_argv(spec: dict[str, Any], image_entrypoint: Sequence[str]) -> list[str]:
    command = spec.get("command", list(image_entrypoint))
    return [*command, *spec.get("args", [])]


# --- running commands as a container would -----------------------------------------------
def clean_environ() -> dict[str, str]:
    """This machine's environment without any IDEMPAY_* (the container's env is complete)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("IDEMPAY_")}


def shell_argv(
    script_argv: Sequence[str], env: Mapping[str, str], program: str, tmp: Path
) -> list[str]:
    """The argument list ``program`` receives when a `sh -c` container runs: the script is
    run by a real /bin/sh with ``program`` replaced by a stub that records its arguments."""
    assert script_argv[-2:-1] == ["-c"], script_argv
    stub_dir = tmp / "stub-bin"
    stub_dir.mkdir(exist_ok=True)
    record = tmp / f"{program}.argv"
    stub = stub_dir / program
    stub.write_text(f'#!/bin/sh\nfor arg in "$@"; do printf "%s\\0" "$arg"; done > "{record}"\n')
    stub.chmod(0o755)
    run_env = {**clean_environ(), **env, "PATH": f"{stub_dir}:{os.environ['PATH']}"}
    subprocess.run(["/bin/sh", "-c", script_argv[-1]], env=run_env, check=True, timeout=30)
    assert record.exists(), f"the script never ran {program}"
    return [program, *(arg.decode() for arg in record.read_bytes().split(b"\0")[:-1])]


def idempay_cli() -> Any:
    """The click command tree behind ``idempay`` (typer ships its own click)."""
    return typer.main.get_command(app)


def _is_group(command: Any) -> bool:
    return hasattr(command, "get_command")


def _unparsed(context: Any) -> list[str]:
    """What a group's context left for its subcommand (click 8.2 renamed the attribute)."""
    protected = getattr(context, "_protected_args", None)
    if protected is None:
        protected = context.protected_args
    return [*protected, *context.args]


def parse_idempay(argv: Sequence[str]) -> tuple[str, dict[str, Any]]:
    """Parse an `idempay …` argument list with the real CLI (no command runs): the
    subcommand's path (e.g. "admin create-key", or "acquirer" for the group that runs
    without a subcommand) and its parsed parameters. Raises if a subcommand or an option
    does not exist or a value is invalid."""
    assert argv and Path(argv[0]).name == "idempay", argv
    command = idempay_cli()
    path: list[str] = []
    rest = list(argv[1:])
    parent = None
    while True:
        named = not _is_group(command) or rest or command.invoke_without_command
        assert named, f"`{' '.join(argv)}` names no subcommand"
        context = command.make_context(path[-1] if path else "idempay", rest, parent=parent)
        if not _is_group(command):
            return " ".join(path), dict(context.params)
        rest = _unparsed(context)
        if not rest:  # a group that runs by itself (`idempay acquirer`)
            return " ".join(path), dict(context.params)
        sub = command.get_command(context, rest[0])
        assert sub is not None, f"`idempay {' '.join(path + rest[:1])}` is not a subcommand"
        path.append(rest.pop(0))
        command, parent = sub, context
