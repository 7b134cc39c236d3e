"""A small, strict kustomize renderer for the features deploy/k8s uses, so the tests need no
kustomize binary (none ships on PyPI). It fails on any kustomization field it does not
implement, so a manifest can never use a feature these tests silently ignore.

Differences from `kubectl kustomize`, on purpose: generated ConfigMap/Secret names get no
hash suffix (references therefore match by the plain name, as kustomize resolves them
before hashing), and Secret values stay plain strings (no base64).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

SUPPORTED = {
    "apiVersion",
    "kind",
    "namespace",
    "resources",
    "images",
    "configMapGenerator",
    "secretGenerator",
    "generatorOptions",
    "patches",
}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PersistentVolume"}
POD_TEMPLATE_PATHS = {
    "Deployment": ("spec", "template", "spec"),
    "StatefulSet": ("spec", "template", "spec"),
    "Job": ("spec", "template", "spec"),
    "CronJob": ("spec", "jobTemplate", "spec", "template", "spec"),
}

Doc = dict[str, Any]


class KustomizeError(AssertionError):
    """The kustomization is invalid or uses something this renderer does not implement."""


def load_yaml_docs(path: Path) -> list[Doc]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def render(root: Path, *, env_files: dict[str, Path] | None = None) -> list[Doc]:
    """The objects `kubectl kustomize root` would print. ``env_files`` maps an env file
    named by a generator (e.g. the gitignored ``secret.env``) to the file to read instead."""
    kustomization = root / "kustomization.yaml"
    if not kustomization.is_file():
        raise KustomizeError(f"{root} has no kustomization.yaml")
    spec = yaml.safe_load(kustomization.read_text())
    unknown = set(spec) - SUPPORTED
    if unknown:
        raise KustomizeError(f"{kustomization}: unsupported fields {sorted(unknown)}")
    if spec.get("kind") != "Kustomization":
        raise KustomizeError(f"{kustomization}: kind must be Kustomization")
    docs: list[Doc] = []
    for entry in spec.get("resources", []):
        path = (root / entry).resolve()
        if path.is_dir():
            docs.extend(render(path, env_files=env_files))
        elif path.is_file():
            docs.extend(load_yaml_docs(path))
        else:
            raise KustomizeError(f"{kustomization}: resource {entry!r} does not exist")
    options = spec.get("generatorOptions", {})
    for kind, key in (("ConfigMap", "configMapGenerator"), ("Secret", "secretGenerator")):
        for generator in spec.get(key, []):
            _generate(docs, kind, generator, root, options, env_files or {})
    for patch in spec.get("patches", []):
        _patch(docs, patch)
    for image in spec.get("images", []):
        _set_image(docs, image)
    if "namespace" in spec:
        _set_namespace(docs, spec["namespace"])
    return docs


def read_env_file(path: Path) -> dict[str, str]:
    values: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.partition("=")
        if not sep:
            raise KustomizeError(f"{path}: not KEY=VALUE: {line!r}")
        values[name] = value
    return values


def _generate(
    docs: list[Doc],
    kind: str,
    generator: Doc,
    root: Path,
    options: Doc,
    env_files: dict[str, Path],
) -> None:
    unknown = set(generator) - {"name", "envs", "literals", "behavior", "options"}
    if unknown:
        raise KustomizeError(f"{kind} generator: unsupported fields {sorted(unknown)}")
    data: dict[str, str] = {}
    for env in generator.get("envs", []):
        path = env_files.get(env, root / env)
        if not path.is_file():
            raise KustomizeError(f"{root}: env file {env!r} of {generator['name']} is missing")
        data.update(read_env_file(path))
    for literal in generator.get("literals", []):
        name, _, value = literal.partition("=")
        data[name] = value
    labels = {**options.get("labels", {}), **generator.get("options", {}).get("labels", {})}
    behavior = generator.get("behavior", "create")
    existing = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == generator["name"]]
    if behavior == "create":
        if existing:
            raise KustomizeError(f"{kind} {generator['name']} already exists")
        metadata: Doc = {"name": generator["name"]}
        if labels:
            metadata["labels"] = labels
        docs.append({"apiVersion": "v1", "kind": kind, "metadata": metadata, "data": data})
    elif behavior in ("merge", "replace"):
        if len(existing) != 1:
            raise KustomizeError(f"{kind} {generator['name']} to {behavior} not found")
        target = existing[0]
        target["data"] = {**target["data"], **data} if behavior == "merge" else data
    else:
        raise KustomizeError(f"unknown generator behavior {behavior!r}")


def _patch(docs: list[Doc], patch: Doc) -> None:
    if set(patch) != {"target", "patch"}:
        raise KustomizeError(f"only inline JSON 6902 patches with a target: {patch}")
    target = patch["target"]
    matches = [
        d for d in docs if d["kind"] == target["kind"] and d["metadata"]["name"] == target["name"]
    ]
    if len(matches) != 1:
        raise KustomizeError(f"patch target {target} matches {len(matches)} objects")
    operations = yaml.safe_load(patch["patch"])
    if not isinstance(operations, list):
        raise KustomizeError("only JSON 6902 patches (a list of operations) are supported")
    for operation in operations:
        _json_patch(matches[0], operation)


def _json_patch(doc: Doc, operation: Doc) -> None:
    *parents, last = [
        p.replace("~1", "/").replace("~0", "~") for p in operation["path"][1:].split("/")
    ]
    node: Any = doc
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    key: Any = int(last) if isinstance(node, list) and last != "-" else last
    op = operation["op"]
    if op == "replace":
        node[key]  # noqa: B018 - replace requires the target to exist
        node[key] = copy.deepcopy(operation["value"])
    elif op == "add":
        if isinstance(node, list):
            node.insert(len(node) if key == "-" else key, copy.deepcopy(operation["value"]))
        else:
            node[key] = copy.deepcopy(operation["value"])
    elif op == "remove":
        del node[key]
    else:
        raise KustomizeError(f"unsupported JSON patch op {op!r}")


def pod_spec(doc: Doc) -> Doc | None:
    path = POD_TEMPLATE_PATHS.get(doc["kind"])
    if path is None:
        return None
    node: Any = doc
    for part in path:
        node = node[part]
    return dict(node)


def containers(doc: Doc) -> list[Doc]:
    """Init containers then containers of a workload (the live dicts, not copies)."""
    path = POD_TEMPLATE_PATHS.get(doc["kind"])
    if path is None:
        return []
    node: Any = doc
    for part in path:
        node = node[part]
    return list(node.get("initContainers", [])) + list(node.get("containers", []))


def _set_image(docs: list[Doc], image: Doc) -> None:
    for doc in docs:
        for container in containers(doc):
            name, _, tag = container["image"].partition(":")
            if name != image["name"]:
                continue
            name = image.get("newName", name)
            tag = image.get("newTag", tag)
            container["image"] = f"{name}:{tag}" if tag else name


def _set_namespace(docs: list[Doc], namespace: str) -> None:
    for doc in docs:
        if doc["kind"] == "Namespace":
            continue
        if doc["kind"] not in CLUSTER_SCOPED:
            doc["metadata"]["namespace"] = namespace
        if doc["kind"] in ("RoleBinding", "ClusterRoleBinding"):
            for subject in doc.get("subjects", []):
                if subject["kind"] == "ServiceAccount":
                    subject["namespace"] = namespace
