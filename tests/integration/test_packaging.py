"""The Helm chart and the kustomize overlays install on a real API server, and the operator's
ServiceAccount can do exactly what the operator does."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from controlplane import REPO_ROOT, ControlPlane, KubectlError
from gymkube_dev.ports import free_port
from gymkube_dev.processes import stop
from gymkube_dev.push import CHART_IMAGE_VALUES, pushed_ref, pushed_values
from gymkube_operator.envpool.builders import build_children, owner, parse_spec
from gymkube_operator.settings import OperatorSettings
from operator_support import wait_for_crds

pytestmark = pytest.mark.integration

CHART = REPO_ROOT / "charts" / "gymkube"
SCENARIOS = sorted((CHART / "ci").glob("*-values.yaml"))
OVERLAYS = sorted(
    p.parent for p in (REPO_ROOT / "kustomize" / "overlays").glob("*/kustomization.yaml")
)
BASE_NAMESPACE = "gymkube-system"
RELEASE = "gymkube"
# The Prometheus Operator release whose ServiceMonitor and PodMonitor CRDs the chart's monitors
# are checked against (fetched once through the Go module proxy into the module cache).
PROMETHEUS_OPERATOR_MODULE = "github.com/prometheus-operator/prometheus-operator@v0.85.0"
MONITOR_CRDS = {
    f"{plural}.monitoring.coreos.com": (
        f"example/prometheus-operator-crd/monitoring.coreos.com_{plural}.yaml"
    )
    for plural in ("servicemonitors", "podmonitors")
}
TIMEOUT_S = 120

# What the operator does through the API, as (verb, group, resource): kopf's watches and patches,
# the builders' server-side applies, the watchdog's pod deletions, trainer log reads, a custom
# agent loop's ConfigMap looked up, status writes and events.
OPERATOR_NEEDS: frozenset[tuple[str, str, str]] = frozenset(
    {(verb, "gymkube.io", kind) for verb in ("get", "list", "watch", "patch")
     for kind in ("envpools", "trainingruns", "evalruns")}
    | {("delete", "gymkube.io", kind) for kind in ("trainingruns", "evalruns")}
    | {("patch", "gymkube.io", f"{kind}/status")
       for kind in ("envpools", "trainingruns", "evalruns")}
    | {("update", "gymkube.io", f"{kind}/finalizers")
       for kind in ("envpools", "trainingruns", "evalruns")}
    | {(verb, "apps", kind) for verb in ("list", "watch", "create", "patch")
       for kind in ("statefulsets", "deployments")}
    | {("delete", "apps", "statefulsets")}
    | {(verb, "", kind) for verb in ("create", "patch") for kind in ("services", "configmaps")}
    | {("get", "", "configmaps")}
    | {("create", "policy", "poddisruptionbudgets"), ("patch", "policy", "poddisruptionbudgets")}
    | {(verb, "networking.k8s.io", "networkpolicies")
       for verb in ("get", "create", "patch", "delete")}
    | {(verb, "", "pods") for verb in ("list", "watch", "delete")}
    | {("get", "", "pods/log")}
    | {(verb, group, kind) for verb in ("get", "list", "watch", "create", "patch")
       for group, kind in (("batch", "jobs"), ("ray.io", "rayjobs"))}
    | {(verb, "", "events") for verb in ("create", "list")}
    # A queued run's Kueue Workload, and its place in the LocalQueue.
    | {(verb, "kueue.x-k8s.io", "workloads") for verb in ("list", "watch")}
    | {("get", "visibility.kueue.x-k8s.io", "localqueues/pendingworkloads")}
)  # fmt: skip
# Things a compromised operator must not be able to do anywhere.
NEVER_ALLOWED = [
    ("get", "", "secrets"),
    ("list", "", "secrets"),
    ("create", "", "pods"),
    ("create", "", "pods/exec"),
    ("update", "apps", "statefulsets"),
    ("delete", "apps", "deployments"),
    ("delete", "gymkube.io", "envpools"),
    ("create", "rbac.authorization.k8s.io", "roles"),
    ("create", "", "serviceaccounts/token"),
]


def tool(kube: ControlPlane, name: str, *args: str, input: str | None = None) -> str:
    done = subprocess.run(
        [str(kube.bin_dir / name), *args],
        input=input, capture_output=True, text=True, env=kube.env(), timeout=TIMEOUT_S,
    )  # fmt: skip
    if done.returncode != 0:
        pytest.fail(f"{name} {' '.join(args)} failed:\n{done.stderr}")
    return done.stdout


def helm_template(kube: ControlPlane, namespace: str, *args: str) -> str:
    return tool(
        kube, "helm", "template", RELEASE, str(CHART), "--namespace", namespace,
        "--kube-version", kube_version(kube), *args,
    )  # fmt: skip


def kube_version(kube: ControlPlane) -> str:
    version: dict[str, Any] = json.loads(kube.kubectl("version", "-o", "json").stdout)
    return str(version["serverVersion"]["gitVersion"])


def dry_run(kube: ControlPlane, manifests: str) -> list[str]:
    """Server-side dry-run apply; returns kubectl's `<kind>/<name> ... (server dry run)` lines.
    Warnings fail it too, e.g. a pod template that a restricted namespace would refuse."""
    result = kube.kubectl(
        "apply", "--server-side", "--dry-run=server", "--field-manager=gymkube-packaging-test",
        "-f", "-", input=manifests,
    )  # fmt: skip
    assert "Warning" not in result.stderr, result.stderr
    return result.stdout.splitlines()


def ensure_namespace(kube: ControlPlane, name: str) -> None:
    manifest = yaml.safe_dump({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    kube.kubectl("apply", "--server-side", "-f", "-", input=manifest)


@pytest.fixture(scope="module")
def crds(kube: ControlPlane) -> None:
    """The chart's CRDs (generated from the operator's models), applied and established."""
    kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CHART / "crds"))
    wait_for_crds(kube)


@pytest.fixture(scope="module")
def monitor_crds(kube: ControlPlane) -> None:
    """The real ServiceMonitor and PodMonitor CRDs of the Prometheus Operator, from its Go
    module."""
    download = subprocess.run(
        ["go", "mod", "download", "-json", PROMETHEUS_OPERATOR_MODULE],
        capture_output=True, text=True, timeout=600, cwd=kube.workdir,
    )  # fmt: skip
    if download.returncode != 0:
        pytest.fail(f"go mod download {PROMETHEUS_OPERATOR_MODULE}: {download.stdout}")
    module = Path(json.loads(download.stdout)["Dir"])
    for name, crd in MONITOR_CRDS.items():
        kube.kubectl("apply", "--server-side", "-f", str(module / crd))
        kube.kubectl(
            "wait", "--for=condition=Established", f"--timeout={TIMEOUT_S}s", f"crd/{name}"
        )


@pytest.fixture(scope="module")
def watched_namespaces(kube: ControlPlane) -> Iterator[None]:
    """The namespaces the namespaced-mode scenario watches (its Roles live there)."""
    values = yaml.safe_load((CHART / "ci" / "namespaced-values.yaml").read_text())
    for name in values["watchNamespaces"]:
        ensure_namespace(kube, name)
    yield
    for name in values["watchNamespaces"]:
        kube.kubectl("delete", "namespace", name, "--wait=false")


@pytest.fixture(scope="module")
def base_namespace(kube: ControlPlane) -> Iterator[None]:
    """gymkube-system as the kustomize base makes it (restricted Pod Security Standard)."""
    base_namespace_file = REPO_ROOT / "kustomize" / "base" / "operator" / "namespace.yaml"
    kube.kubectl("apply", "--server-side", "-f", str(base_namespace_file))
    yield
    kube.kubectl("delete", "namespace", BASE_NAMESPACE, "--wait=false")


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda p: p.name)
def test_helm_lint_is_clean(kube: ControlPlane, scenario: Path) -> None:
    output = tool(
        kube, "helm", "lint", "--strict", str(CHART), "--values", str(scenario),
        "--kube-version", kube_version(kube),
    )  # fmt: skip
    assert "0 chart(s) failed" in output


@pytest.mark.parametrize(
    ("setting", "complaint"),
    [
        ("imagee.tag=1", "additional properties 'imagee' not allowed"),
        ("logLevel=verbose", "value must be one of"),
        ("watchNamespaces[0]=Not_A_Namespace", "does not match pattern"),
        ("defaultImages.pullPolicy=Sometimes", "value must be one of"),
    ],
)
def test_values_schema_rejects_typos_and_bad_values(
    kube: ControlPlane, setting: str, complaint: str
) -> None:
    done = subprocess.run(
        [str(kube.bin_dir / "helm"), "template", RELEASE, str(CHART), "--set", setting,
         "--kube-version", kube_version(kube)],
        capture_output=True, text=True, timeout=TIMEOUT_S,
    )  # fmt: skip
    assert done.returncode != 0
    assert complaint in done.stderr


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda p: p.name)
@pytest.mark.usefixtures("crds", "monitor_crds", "watched_namespaces")
def test_chart_scenario_passes_server_side_dry_run(
    kube: ControlPlane, namespace: str, scenario: Path
) -> None:
    # The operator pod must be admitted where only the restricted Pod Security Standard is.
    kube.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted")
    manifests = helm_template(kube, namespace, "--values", str(scenario))
    applied = dry_run(kube, manifests)
    assert any(line.startswith(f"deployment.apps/{RELEASE}") for line in applied), applied
    assert all(line.endswith("(server dry run)") for line in applied), applied


def test_the_values_make_push_writes_take_every_image_from_the_registry(
    kube: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    registry = "registry.example.com:5000/team"
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(pushed_values(registry, list(CHART_IMAGE_VALUES))))
    documents = yaml.safe_load_all(helm_template(kube, namespace, "--values", str(values)))
    (deployment,) = [d for d in documents if d and d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    images = [container["image"]] + [
        item["value"] for item in container["env"] if item["name"].endswith("_IMAGE")
    ]
    assert sorted(images) == sorted(pushed_ref(registry, name) for name in CHART_IMAGE_VALUES)


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
@pytest.mark.usefixtures("crds", "base_namespace")
def test_kustomize_overlay_passes_server_side_dry_run(kube: ControlPlane, overlay: Path) -> None:
    applied = dry_run(kube, tool(kube, "kustomize", "build", str(overlay)))
    kinds = {line.split("/", 1)[0] for line in applied}
    assert {
        "customresourcedefinition.apiextensions.k8s.io",
        "clusterrole.rbac.authorization.k8s.io",
        "deployment.apps",
        "serviceaccount",
    } <= kinds, applied


def test_the_no_network_policy_component_turns_pool_policies_off(
    kube: ControlPlane, tmp_path: Path
) -> None:
    kustomize = REPO_ROOT / "kustomize"
    overlay = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        # kustomize takes other roots only as relative paths.
        "resources": [os.path.relpath(kustomize / "overlays" / "dev", tmp_path)],
        "components": [os.path.relpath(kustomize / "components" / "no-network-policy", tmp_path)],
    }
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(overlay))

    def network_policy_setting(path: Path) -> str:
        documents = yaml.safe_load_all(tool(kube, "kustomize", "build", str(path)))
        (deployment,) = [d for d in documents if d["kind"] == "Deployment"]
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        env = {item["name"]: item.get("value") for item in container["env"]}
        return str(env["GYMKUBE_NETWORK_POLICY"])

    assert network_policy_setting(kustomize / "overlays" / "dev") == "true"
    assert network_policy_setting(tmp_path) == "false"


# --- what the operator's ServiceAccount may do ---------------------------------------------------


@pytest.fixture
def install_rbac(kube: ControlPlane, namespace: str) -> Iterator[Callable[..., str]]:
    """Really applies the chart's ServiceAccount and RBAC into the test's namespace (with extra
    helm arguments); returns the ServiceAccount's user name. Removes them, cluster-wide ones too."""
    installed: list[str] = []

    def install(*args: str) -> str:
        manifests = helm_template(
            kube, namespace, "--show-only", "templates/serviceaccount.yaml",
            "--show-only", "templates/rbac.yaml", *args,
        )  # fmt: skip
        kube.kubectl("apply", "--server-side", "-f", "-", input=manifests)
        installed.append(manifests)
        account = next(
            doc for doc in yaml.safe_load_all(manifests) if doc and doc["kind"] == "ServiceAccount"
        )
        return f"system:serviceaccount:{namespace}:{account['metadata']['name']}"

    yield install
    for manifests in installed:
        kube.kubectl("delete", "--ignore-not-found", "--wait=false", "-f", "-", input=manifests)


def can_i(kube: ControlPlane, user: str, verb: str, group: str, resource: str, ns: str) -> bool:
    """A SubjectAccessReview for the ServiceAccount user, with the groups the API server gives it
    (it works for resources whose CRD is not installed, such as KubeRay's RayJob here)."""
    kind, _, subresource = resource.partition("/")
    service_account_namespace = user.split(":")[2]
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": user,
            "groups": [
                "system:serviceaccounts",
                f"system:serviceaccounts:{service_account_namespace}",
                "system:authenticated",
            ],
            "resourceAttributes": {
                "namespace": ns, "verb": verb, "group": group,
                "resource": kind, "subresource": subresource,
            },
        },
    }  # fmt: skip
    answer = kube.kubectl(
        "create", "--validate=false", "-f", "-", "-o", "json", input=json.dumps(review)
    ).stdout
    return bool(json.loads(answer)["status"].get("allowed", False))


def granted(kube: ControlPlane, user: str, namespace: str) -> set[tuple[str, str, str]]:
    """Every (verb, group, resource) the user may use in the namespace (a SelfSubjectRulesReview),
    less what every authenticated user may do (the same review for a user without bindings)."""

    def review(as_user: str) -> set[tuple[str, str, str]]:
        body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectRulesReview",
                "spec": {"namespace": namespace}}  # fmt: skip
        result = json.loads(
            kube.kubectl(
                "create",
                "--validate=false",
                "-f",
                "-",
                "-o",
                "json",
                f"--as={as_user}",
                input=json.dumps(body),
            ).stdout
        )
        return {
            (verb, group, resource)
            for rule in result["status"]["resourceRules"]
            for verb in rule["verbs"]
            for group in rule.get("apiGroups", [])
            for resource in rule.get("resources", [])
        }

    return review(user) - review("gymkube-packaging-test:nobody")


@pytest.mark.usefixtures("crds")
def test_cluster_mode_grants_exactly_what_the_operator_uses(
    kube: ControlPlane, namespace: str, install_rbac: Callable[..., str]
) -> None:
    user = install_rbac()
    crd_watch = {(verb, "apiextensions.k8s.io", "customresourcedefinitions")
                 for verb in ("list", "watch")}  # fmt: skip
    # The ClusterRole applies in every namespace, not just the operator's own.
    assert granted(kube, user, "default") == OPERATOR_NEEDS | crd_watch
    for verb, group, resource in sorted(OPERATOR_NEEDS):
        assert can_i(kube, user, verb, group, resource, namespace), (verb, group, resource)
    for verb, group, resource in NEVER_ALLOWED:
        assert not can_i(kube, user, verb, group, resource, namespace), (verb, group, resource)


@pytest.mark.usefixtures("crds", "watched_namespaces")
def test_namespaced_mode_grants_nothing_outside_the_watch_list(
    kube: ControlPlane, namespace: str, install_rbac: Callable[..., str]
) -> None:
    values = yaml.safe_load((CHART / "ci" / "namespaced-values.yaml").read_text())
    watched = values["watchNamespaces"]
    user = install_rbac("--values", str(CHART / "ci" / "namespaced-values.yaml"))
    for name in watched:
        assert granted(kube, user, name) == OPERATOR_NEEDS
    # Neither the operator's own namespace (not in the list) nor any cluster-scoped resource.
    assert granted(kube, user, namespace) == set()
    assert not can_i(kube, user, "list", "apiextensions.k8s.io", "customresourcedefinitions", "")


@pytest.mark.usefixtures("crds")
def test_service_account_can_apply_every_envpool_child(
    kube: ControlPlane, namespace: str, install_rbac: Callable[..., str]
) -> None:
    """The objects the operator's own builders make, server-side applied as its ServiceAccount."""
    user = install_rbac()
    pool = yaml.safe_load(
        kube.kubectl(
            "create", "-o", "yaml", "-f", "-", f"--namespace={namespace}",
            input=yaml.safe_dump({"apiVersion": "gymkube.io/v1alpha1", "kind": "EnvPool",
                                  "metadata": {"name": "lake"}, "spec": {"env": "frozen_lake"}}),
        ).stdout
    )  # fmt: skip
    children = build_children(
        owner("lake", namespace, pool["metadata"]["uid"]),
        parse_spec(pool["spec"]),
        OperatorSettings(**chart_operator_settings(kube, namespace)),
    )
    assert "NetworkPolicy" in {child["kind"] for child in children}
    manifests = "---\n".join(yaml.safe_dump(child) for child in children)
    applied = kube.kubectl(
        "apply", "--server-side", "--force-conflicts", "--field-manager=gymkube-operator",
        f"--as={user}", "-f", "-", input=manifests,
    ).stdout  # fmt: skip
    assert applied.count("serverside-applied") == len(children), applied
    with pytest.raises(KubectlError, match="forbidden"):
        kube.kubectl("get", "secrets", f"--namespace={namespace}", f"--as={user}")


def chart_operator_deployment(kube: ControlPlane, namespace: str, *args: str) -> dict[str, Any]:
    rendered = helm_template(kube, namespace, "--show-only", "templates/deployment.yaml", *args)
    deployment: dict[str, Any] = yaml.safe_load(rendered)
    return deployment


def chart_operator_env(kube: ControlPlane, namespace: str, *args: str) -> dict[str, str]:
    """The GYMKUBE_* settings the chart's Deployment gives the operator container (the downward
    API's namespace is the release's)."""
    deployment = chart_operator_deployment(kube, namespace, *args)
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    downward = {"metadata.namespace": namespace}
    return {
        item["name"]: item["value"]
        if "value" in item
        else downward[item["valueFrom"]["fieldRef"]["fieldPath"]]
        for item in container["env"]
    }


def chart_operator_settings(kube: ControlPlane, namespace: str) -> dict[str, str]:
    """The chart's settings as OperatorSettings field values."""
    env = chart_operator_env(kube, namespace)
    return {k.removeprefix("GYMKUBE_").lower(): v for k, v in env.items()}


def test_the_pool_policies_let_in_the_operator_pod_the_chart_runs(kube: ControlPlane) -> None:
    """GYMKUBE_OPERATOR_POD_LABELS select the chart's operator pod, so the policies that the
    operator gives each pool admit its own probes and drains (a mismatch would make every pool
    unreachable to the watchdog where NetworkPolicy is enforced)."""
    deployment = chart_operator_deployment(kube, "gymkube-system", "--set", "podLabels.team=rl")
    settings = OperatorSettings(**chart_operator_settings(kube, "gymkube-system"))
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert settings.network_policy
    assert settings.operator_namespace == "gymkube-system"
    assert settings.operator_pod_labels.items() <= pod_labels.items()
    assert settings.operator_pod_labels == deployment["spec"]["selector"]["matchLabels"]
    off = chart_operator_env(kube, "gymkube-system", "--set", "networkPolicy.enabled=false")
    assert off["GYMKUBE_NETWORK_POLICY"] == "false"


def wait_for(what: str, probe: Callable[[], bool], log: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not probe():
        if time.monotonic() > deadline:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
            pytest.fail(f"timed out after {timeout:g}s waiting for {what}; operator log:\n{tail}")
        time.sleep(0.3)


def healthz_answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


@pytest.mark.parametrize(
    "scenario", ["default-values.yaml", "namespaced-values.yaml"], ids=["cluster", "namespaced"]
)
@pytest.mark.usefixtures("crds", "watched_namespaces")
def test_operator_rbac(
    kube: ControlPlane,
    namespace: str,
    install_rbac: Callable[..., str],
    tmp_path: Path,
    scenario: str,
) -> None:
    """The real operator, authenticated as the chart's ServiceAccount and configured by the
    chart's environment, answers the probes' /healthz, builds a pool's children and writes its
    status, and is never refused by the API server, in cluster and in namespaced mode."""
    # A short ServiceAccount name: the user name becomes a certificate CN of at most 64 bytes.
    values = ("--values", str(CHART / "ci" / scenario), "--set", "serviceAccount.name=op")
    watched = yaml.safe_load((CHART / "ci" / scenario).read_text()).get("watchNamespaces")
    pool_namespace = watched[0] if watched else namespace
    user = install_rbac(*values)
    credentials = kube.kubeconfig_for_user(
        user, groups=["system:serviceaccounts", f"system:serviceaccounts:{namespace}"]
    )
    env = {**kube.env(), **chart_operator_env(kube, namespace, *values)}
    env["KUBECONFIG"] = str(credentials)
    env["GYMKUBE_LIVENESS_PORT"] = str(port := free_port())
    log_path = tmp_path / "operator.log"
    pool = {"apiVersion": "gymkube.io/v1alpha1", "kind": "EnvPool", "metadata": {"name": "lake"},
            "spec": {"env": "frozen_lake", "replicas": 1}}  # fmt: skip
    ns = f"--namespace={pool_namespace}"
    with log_path.open("wb") as log:
        operator = subprocess.Popen(
            [str(Path(sys.executable).parent / "gymkube-operator")],
            env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    try:
        wait_for("the operator's /healthz", lambda: healthz_answers(port), log_path)
        kube.kubectl("apply", "--server-side", ns, "-f", "-", input=yaml.safe_dump(pool))

        def children_and_status() -> bool:
            found = kube.kubectl(
                "get", ns, "statefulset/lake", "deployment/lake-router", "service/lake",
                "service/lake-backends", "poddisruptionbudget/lake",
                "networkpolicy/lake-envservers", "-o", "name", check=False,
            )  # fmt: skip
            status = kube.kubectl("get", ns, "envpool/lake", "-o", "jsonpath={.status}").stdout
            return found.returncode == 0 and '"conditions"' in status

        wait_for("the pool's children and status", children_and_status, log_path)
        kube.kubectl("delete", ns, "envpool/lake", f"--timeout={TIMEOUT_S}s")
    finally:
        stop(operator)
    log_text = log_path.read_text(errors="replace")
    # In cluster mode the operator also sees other tests' namespaces; writes into one that is
    # being deleted are refused for that reason (NamespaceTerminating), not for RBAC. A 403 after
    # a comma is a log timestamp's milliseconds (13:12:08,403), not a status.
    refused = [
        line
        for line in log_text.splitlines()
        if re.search(r"forbidden|(?<!,)\b403\b", line, re.I) and "NamespaceTerminating" not in line
    ]
    assert refused == [], "\n".join(refused)
