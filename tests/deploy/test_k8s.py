"""deploy/k8s: both kustomizations render, every object passes the Kubernetes 1.37 schema
(strict), and every workload runs a real `idempay` command with the settings it needs, on
the port the probes and the Service use, unprivileged, all on the one acquirer-sim, and with
no secret committed."""

from __future__ import annotations

import copy
import ipaddress
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

from analytics.jobs import daily_audit
from tests.deploy import kustomize
from tests.deploy.manifests import (
    DEPLOY,
    K8S,
    LOCAL_OVERLAY,
    ROOT,
    SETTINGS_ENV,
    container,
    container_env,
    dockerfile_stages,
    find,
    k8s_argv,
    parse_idempay,
    render_base,
    render_local,
    shell_argv,
)

K8S_VERSION = "1.37.0"
ENTRYPOINT = dockerfile_stages(DEPLOY / "Dockerfile")[-1].exec_form("ENTRYPOINT")
WORKLOADS = {  # (kind, name, container) → idempay subcommand
    ("Deployment", "idempay-api", "api"): "serve",
    ("Deployment", "idempay-relay", "relay"): "relay",
    ("Deployment", "idempay-completer", "completer"): "completer",
    ("Job", "idempay-migrate", "migrate"): "migrate",
    ("CronJob", "idempay-daily-audit", "export"): "export",
    ("Deployment", "idempay-acquirer-sim", "acquirer"): "acquirer",
}
ACQUIRER = ("Deployment", "idempay-acquirer-sim", "acquirer")
APP = {workload: command for workload, command in WORKLOADS.items() if workload != ACQUIRER}
NEEDS_REDIS = {"serve", "relay", "completer"}
SECRET_KEYS = {"IDEMPAY_DATABASE_URL", "IDEMPAY_REDIS_URL", "IDEMPAY_SECRET_KEY"}
RENDERS = {"base": render_base, "local": render_local}
# What the base expects the Secret `idempay-secrets` to hold (created outside the base).
EXTERNAL = {"idempay-secrets": kustomize.read_env_file(LOCAL_OVERLAY / "secret.env.example")}


@pytest.fixture(scope="module", params=sorted(RENDERS))
def docs(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    return RENDERS[request.param]()


def _days() -> set[str]:
    """Yesterday in UTC (either side of a midnight the test might straddle)."""
    return {(datetime.now(UTC) - timedelta(days=n)).date().isoformat() for n in (0, 1)}


def test_every_manifest_file_belongs_to_a_kustomization() -> None:
    listed: set[Path] = set()
    for kustomization in K8S.rglob("kustomization.yaml"):
        spec = yaml.safe_load(kustomization.read_text())
        for entry in spec.get("resources", []):
            path = (kustomization.parent / entry).resolve()
            assert path.exists(), f"{kustomization}: {entry} does not exist"
            listed.add(path)
    manifests = {p.resolve() for p in K8S.rglob("*.yaml") if p.name != "kustomization.yaml"}
    assert manifests - listed == set(), "manifests no kustomization lists"


def test_objects_pass_the_kubernetes_schema_strictly(docs: list[dict[str, Any]]) -> None:
    kinds = set()
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        kinds.add(doc["kind"])
    expected = {"Deployment", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler"}
    assert expected | {"Job", "CronJob", "ConfigMap", "PersistentVolumeClaim"} <= kinds


def test_the_schema_check_rejects_a_typo() -> None:
    api = copy.deepcopy(find(render_base(), "Deployment", "idempay-api"))
    api["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(api, K8S_VERSION, strict=True)


def test_the_renderer_refuses_a_missing_resource(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        "resources:\n  - gone.yaml\n"
    )
    with pytest.raises(kustomize.KustomizeError, match="gone.yaml"):
        kustomize.render(tmp_path)


def test_every_container_runs_a_real_idempay_subcommand(
    docs: list[dict[str, Any]], tmp_path: Path
) -> None:
    for (kind, name, container_name), subcommand in WORKLOADS.items():
        doc = find(docs, kind, name)
        spec = container(doc, container_name)
        assert spec["image"].split(":")[0] == "idempay"
        argv = k8s_argv(spec, ENTRYPOINT)
        if argv[:2] == ["/bin/sh", "-c"]:
            env = container_env(docs, doc, spec, external=EXTERNAL)
            argv = shell_argv(argv, env, "idempay", tmp_path)
        command, params = parse_idempay(argv)
        assert command == subcommand, name
        if command == "serve":
            assert params == {
                "host": "0.0.0.0",
                "port": 8000,
                "workers": 2,
                "migrate_first": False,
                "allow_dev_secret": False,  # a real secret is supplied, never the development one
            }
        if command == "export":
            assert params["day"] in _days() and str(params["lake_dir"]) == "/lake"


def test_each_process_gets_the_settings_it_needs() -> None:
    assert set(EXTERNAL["idempay-secrets"]) >= SECRET_KEYS
    for docs in (render_base(), render_local()):
        for (kind, name, container_name), subcommand in APP.items():
            doc = find(docs, kind, name)
            spec = container(doc, container_name)
            refs = [s["secretRef"]["name"] for s in spec["envFrom"] if "secretRef" in s]
            assert refs == ["idempay-secrets"], name
            env = container_env(docs, doc, spec, external=EXTERNAL)
            required = {"IDEMPAY_DATABASE_URL", "IDEMPAY_SECRET_KEY"}
            required |= {"IDEMPAY_REDIS_URL"} if subcommand in NEEDS_REDIS else set()
            assert all(env.get(key) for key in required), (name, required - set(env))
            unknown = {k for k in env if k.startswith("IDEMPAY_")} - SETTINGS_ENV
            assert not unknown, f"{name}: not settings of api.config.Settings: {unknown}"


def test_configmaps_hold_known_settings_and_no_secrets() -> None:
    config = find(render_base(), "ConfigMap", "idempay-config")["data"]
    assert set(config) <= SETTINGS_ENV | {"FORWARDED_ALLOW_IPS"}  # uvicorn's own
    assert not set(config) & SECRET_KEYS
    for doc in render_base():
        assert doc["kind"] != "Secret", "the base commits no Secret"


def test_the_local_secret_file_is_gitignored() -> None:
    result = subprocess.run(
        ["git", "check-ignore", "-q", str(LOCAL_OVERLAY / "secret.env")], cwd=ROOT, check=False
    )
    assert result.returncode == 0
    tracked = subprocess.run(
        ["git", "ls-files", "--", "deploy"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    assert not [path for path in tracked if path.endswith("secret.env")]


def test_api_port_probes_and_service_agree(docs: list[dict[str, Any]]) -> None:
    api = find(docs, "Deployment", "idempay-api")
    spec = container(api, "api")
    assert spec["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    assert spec["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert spec["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert spec["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    pod_labels = api["spec"]["template"]["metadata"]["labels"]
    assert api["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    service = find(docs, "Service", "idempay-api")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["http"]
    pdb = find(docs, "PodDisruptionBudget", "idempay-api")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    hpa = find(docs, "HorizontalPodAutoscaler", "idempay-api")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "idempay-api",
    }
    assert hpa["spec"]["minReplicas"] >= 2 and pdb["spec"]["maxUnavailable"] == 1


def test_containers_run_unprivileged_on_a_read_only_root(docs: list[dict[str, Any]]) -> None:
    for doc in docs:
        pod = kustomize.pod_spec(doc)
        if pod is None or doc["metadata"]["name"] in ("postgres", "redis"):
            continue
        assert pod["securityContext"]["runAsNonRoot"] is True, doc["metadata"]["name"]
        assert pod["securityContext"]["runAsUser"] == 10001
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for spec in kustomize.containers(doc):
            context = spec["securityContext"]
            assert context["readOnlyRootFilesystem"] is True, spec["name"]
            assert context["allowPrivilegeEscalation"] is False
            assert context["capabilities"] == {"drop": ["ALL"]}
            assert {"requests", "limits"} <= set(spec["resources"]), spec["name"]
            tmp = [m for m in spec["volumeMounts"] if m["mountPath"] == "/tmp"]
            assert tmp and "emptyDir" in volumes[tmp[0]["name"]], spec["name"]


def test_migration_phase_brings_everything_the_job_needs() -> None:
    """`kubectl apply -k … -l idempay.dev/phase=migrate` must create the Job and all it uses."""
    docs = render_local()
    phase = [
        d for d in docs if d["metadata"].get("labels", {}).get("idempay.dev/phase") == "migrate"
    ]
    present = {(d["kind"], d["metadata"]["name"]) for d in phase}
    job = find(docs, "Job", "idempay-migrate")
    assert ("Job", "idempay-migrate") in present
    assert ("ServiceAccount", job["spec"]["template"]["spec"]["serviceAccountName"]) in present
    for source in container(job, "migrate")["envFrom"]:
        ((key, ref),) = source.items()
        assert ({"configMapRef": "ConfigMap", "secretRef": "Secret"}[key], ref["name"]) in present
    assert {("Namespace", "idempay-local"), ("StatefulSet", "postgres")} <= present


def test_cronjob_submits_the_daily_audit_to_kubernetes(
    docs: list[dict[str, Any]], tmp_path: Path
) -> None:
    cron = find(docs, "CronJob", "idempay-daily-audit")
    assert cron["spec"]["timeZone"] == "Etc/UTC" and cron["spec"]["concurrencyPolicy"] == "Forbid"
    spec = container(cron, "audit")
    env = container_env(docs, cron, spec)
    argv = k8s_argv(spec, [])
    assert argv[:4] == ["/usr/bin/tini", "--", "/bin/sh", "-c"]
    submit = shell_argv(argv[2:], env, "spark-submit", tmp_path)
    conf = dict(submit[i + 1].split("=", 1) for i, arg in enumerate(submit) if arg == "--conf")
    master = submit[submit.index("--master") + 1]
    local = "namespace" in cron["metadata"]
    assert master == ("local[2]" if local else "k8s://https://kubernetes.default.svc")
    assert conf["spark.kubernetes.container.image"] == spec["image"]
    assert conf["spark.kubernetes.authenticate.driver.serviceAccountName"] == "idempay-spark"
    pod = kustomize.pod_spec(cron)
    assert pod and pod["serviceAccountName"] == "idempay-spark"
    lake = next(v for v in pod["volumes"] if v["name"] == "lake")["persistentVolumeClaim"]
    prefix = "spark.kubernetes.executor.volumes.persistentVolumeClaim.lake"
    assert conf[f"{prefix}.options.claimName"] == lake["claimName"]
    assert find(docs, "PersistentVolumeClaim", lake["claimName"])
    mounts = {m["name"]: m["mountPath"] for m in spec["volumeMounts"]}
    assert conf[f"{prefix}.mount.path"] == mounts["lake"] == env["LAKE_DIR"]
    job = submit.index("analytics/jobs/daily_audit.py")
    args = daily_audit.parse_args(submit[job + 1 :])
    assert args.start == args.end and args.start.isoformat() in _days()
    assert args.lake == "/lake" and args.out == Path(f"/lake/audit/{args.start}")


def test_spark_service_account_may_manage_executor_pods(docs: list[dict[str, Any]]) -> None:
    binding = find(docs, "RoleBinding", "idempay-spark")
    assert binding["roleRef"]["name"] == "idempay-spark"
    assert [s["name"] for s in binding["subjects"]] == ["idempay-spark"]
    rules = find(docs, "Role", "idempay-spark")["rules"]
    assert any("pods" in r["resources"] and "create" in r["verbs"] for r in rules)
    find(docs, "ServiceAccount", "idempay-spark")


def test_overlay_images_are_the_locally_built_ones() -> None:
    images = {
        spec["image"]
        for doc in render_local()
        for spec in kustomize.containers(doc)
        if spec["image"].startswith("idempay")
    }
    assert images == {"idempay:local", "idempay-spark:local"}
    base = {s["image"] for d in render_base() for s in kustomize.containers(d)}
    assert base == {"idempay:0.1.0", "idempay-spark:0.1.0"}


def test_the_api_trusts_x_forwarded_for_from_named_proxies_only() -> None:
    """Set (or every client is the ingress's address), and a list of real networks: never
    "*" nor a catch-all, under which any peer could pick its address."""
    for docs in (render_base(), render_local()):
        doc = find(docs, "Deployment", "idempay-api")
        env = container_env(docs, doc, container(doc, "api"), external=EXTERNAL)
        trusted = [
            ipaddress.ip_network(part.strip()) for part in env["FORWARDED_ALLOW_IPS"].split(",")
        ]
        assert trusted and all(network.prefixlen >= 8 for network in trusted), trusted


def _acquirer(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The acquirer-sim's Deployment, its container and its parsed `idempay acquirer`."""
    kind, name, container_name = ACQUIRER
    doc = find(docs, kind, name)
    spec = container(doc, container_name)
    command, params = parse_idempay(k8s_argv(spec, ENTRYPOINT))
    assert command == "acquirer"
    return doc, spec, params


def test_every_process_talks_to_the_one_acquirer_sim(docs: list[dict[str, Any]]) -> None:
    """IDEMPAY_ACQUIRER_URL names the acquirer-sim's Service, on a port that reaches the
    host's listening port, for every idempay process (the API and the completer talk to the
    acquirer; `kubectl exec … idempay admin key fence` in any pod does too): without it
    `idempay serve` starts a simulated host inside each API pod."""
    doc, spec, params = _acquirer(docs)
    assert params["host"] == "0.0.0.0"
    (port,) = spec["ports"]
    assert port["containerPort"] == params["port"] and port["protocol"] == "TCP"
    urls = set()
    for kind, name, container_name in APP:
        workload = find(docs, kind, name)
        env = container_env(docs, workload, container(workload, container_name), external=EXTERNAL)
        urls.add(env.get("IDEMPAY_ACQUIRER_URL"))
    assert len(urls) == 1, urls
    url = urlsplit(urls.pop() or "")
    assert url.scheme == "iso8583" and url.hostname and url.port
    service = find(docs, "Service", url.hostname)
    (service_port,) = service["spec"]["ports"]
    assert service_port["port"] == url.port and service_port["targetPort"] == port["name"]
    pod_labels = doc["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert doc["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    others = [
        d
        for d in docs
        if d["kind"] == "Deployment"
        and d is not doc
        and service["spec"]["selector"].items()
        <= d["spec"]["template"]["metadata"]["labels"].items()
    ]
    assert not others, "the acquirer-sim Service selects other pods"


def test_the_acquirer_sim_is_one_pod_with_its_store_on_a_claim(docs: list[dict[str, Any]]) -> None:
    doc, spec, params = _acquirer(docs)
    assert doc["spec"]["replicas"] == 1 and doc["spec"]["strategy"] == {"type": "Recreate"}
    assert not [
        d
        for d in docs
        if d["kind"] == "HorizontalPodAutoscaler"
        and d["spec"]["scaleTargetRef"]["name"] == doc["metadata"]["name"]
    ]
    store = PurePosixPath(params["store"])
    mounts = {m["mountPath"]: m["name"] for m in spec["volumeMounts"]}
    pod = kustomize.pod_spec(doc)
    assert pod is not None
    volumes = {v["name"]: v for v in pod["volumes"]}
    volume = volumes[mounts[str(store.parent)]]
    claim = find(docs, "PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"])
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert pod["securityContext"]["fsGroup"] == 10001  # the claim is the app user's to write


def test_the_acquirer_sim_gets_no_secret(docs: list[dict[str, Any]]) -> None:
    doc, spec, _ = _acquirer(docs)
    assert not [s for s in spec["envFrom"] if "secretRef" in s] and "env" not in spec
    env = container_env(docs, doc, spec)
    assert not SECRET_KEYS & set(env)
    assert not {k for k in env if k.startswith("IDEMPAY_")} - SETTINGS_ENV


def test_the_acquirer_sim_is_ready_on_a_sign_on(docs: list[dict[str, Any]]) -> None:
    _, spec, params = _acquirer(docs)
    command = spec["readinessProbe"]["exec"]["command"]
    assert command[:2] == ["python", "-c"]
    assert "from api.acquirer.host.process import sign_on" in command[2]
    assert f"sign_on({params['port']})" in command[2]
    assert spec["livenessProbe"]["tcpSocket"] == {"port": spec["ports"][0]["name"]}
