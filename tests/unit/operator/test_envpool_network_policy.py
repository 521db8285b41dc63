"""An EnvPool's NetworkPolicy lets in exactly the pods the other builders make for it.

The local cluster's network plugin (the CNI bridge) does not enforce NetworkPolicy, so this checks
the policy against the labels of the real rendered pods with NetworkPolicy's own matching rules.
"""

from dataclasses import dataclass, field
from typing import Any

import pytest
from gymkube_operator.envpool import builders
from gymkube_operator.envpool.models import EnvPoolSpec
from gymkube_operator.settings import OperatorSettings
from gymkube_operator.trainingrun import render
from gymkube_operator.trainingrun.command import Run, RunTarget, ServedPool
from gymkube_operator.trainingrun.models import TrainingRunSpec
from pydantic import ValidationError

pytestmark = pytest.mark.unit

OPERATOR_LABELS = {"app.kubernetes.io/name": "gymkube", "app.kubernetes.io/instance": "gymkube"}
SETTINGS = OperatorSettings(
    network_policy=True, operator_namespace="gymkube-system", operator_pod_labels=OPERATOR_LABELS
)
SPEC = EnvPoolSpec.model_validate({"env": "sciworld"})


@dataclass(frozen=True)
class Pod:
    namespace: str
    labels: dict[str, str]
    namespace_labels: dict[str, str] = field(default_factory=dict)


def pool_pods(pool: str, namespace: str) -> tuple[Pod, Pod]:
    """The env-server and router pods of a pool, from the StatefulSet and Deployment templates."""
    built = builders.build_children(builders.owner(pool, namespace, "uid"), SPEC, SETTINGS)
    workloads = {c["kind"]: c["spec"]["template"] for c in built if "template" in c["spec"]}
    server, router = (
        workloads[kind]["metadata"]["labels"] for kind in ("StatefulSet", "Deployment")
    )
    return Pod(namespace, server), Pod(namespace, router)


def run_pods(pool: str, namespace: str) -> list[Pod]:
    """The preflight and trainer pods of a TrainingRun on the pool."""
    spec = TrainingRunSpec.model_validate({"envPoolRef": {"name": pool}, "model": {"path": "/m"}})
    run = Run("grpo", namespace, "uid", "t", "t-cpu", "p", "Always")
    target = RunTarget(run, spec, "http://x", "sciworld")
    jobs = [render.preflight_job(target), render.training_job(target)]
    return [Pod(namespace, job["spec"]["template"]["metadata"]["labels"]) for job in jobs]


def policy(
    pool: str = "sciworld", namespace: str = "rl", settings: OperatorSettings = SETTINGS
) -> dict[str, Any]:
    built = builders.build_children(builders.owner(pool, namespace, "uid"), SPEC, settings)
    (found,) = [c for c in built if c["kind"] == "NetworkPolicy"]
    return found


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, "the evaluator knows matchLabels only"
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def admits(policy: dict[str, Any], source: Pod, target: Pod, port: str) -> bool:
    """NetworkPolicy ingress semantics: a policy that selects the target allows the source on a
    port if some rule lists that port and a peer matching the source (a peer without a
    namespaceSelector means the policy's own namespace)."""
    meta, spec = policy["metadata"], policy["spec"]
    if target.namespace != meta["namespace"] or not _selects(spec["podSelector"], target.labels):
        return True  # not isolated by this policy
    for rule in spec["ingress"]:
        if port not in {p["port"] for p in rule["ports"]}:
            continue
        for peer in rule["from"]:
            if "namespaceSelector" in peer:
                namespace_labels = {
                    **source.namespace_labels,
                    "kubernetes.io/metadata.name": source.namespace,
                }
                in_namespace = _selects(peer["namespaceSelector"], namespace_labels)
            else:
                in_namespace = source.namespace == meta["namespace"]
            if in_namespace and _selects(peer.get("podSelector", {}), source.labels):
                return True
    return False


OPERATOR = Pod("gymkube-system", {**OPERATOR_LABELS, "app.kubernetes.io/component": "operator"})


def test_the_pools_routers_trainers_and_the_operator_reach_its_sessions() -> None:
    server, router = pool_pods("sciworld", "rl")
    for source in (router, OPERATOR, *run_pods("sciworld", "rl")):
        assert admits(policy(), source, server, "http"), source


def test_only_the_operator_reaches_the_admin_port() -> None:
    server, router = pool_pods("sciworld", "rl")
    assert admits(policy(), OPERATOR, server, "admin")
    for source in (router, *run_pods("sciworld", "rl")):
        assert not admits(policy(), source, server, "admin"), source


def test_other_pools_other_namespaces_and_strangers_are_refused() -> None:
    server, _ = pool_pods("sciworld", "rl")
    _, other_router = pool_pods("frozen-lake", "rl")
    strangers = [
        other_router,
        *run_pods("frozen-lake", "rl"),
        # The same labels one namespace over: a pod elsewhere cannot pass for the pool's router.
        pool_pods("sciworld", "other")[1],
        *run_pods("sciworld", "other"),
        Pod("rl", {"app": "debug-shell"}),
        # An operator lookalike outside the operator's namespace.
        Pod("rl", OPERATOR.labels),
    ]
    for source in strangers:
        assert not admits(policy(), source, server, "http"), source


def test_a_run_over_several_pools_reaches_each_of_them_and_no_other() -> None:
    spec = TrainingRunSpec.model_validate(
        {"envPools": [{"name": "sciworld"}, {"name": "frozen-lake"}], "model": {"path": "/m"}}
    )
    run = Run("mixed", "rl", "uid", "t", "t-cpu", "p", "Always")
    pools = tuple(ServedPool(share, f"http://{share.name}", "sciworld") for share in spec.pools())
    target = RunTarget(run, spec, "http://sciworld", "sciworld", pools)
    jobs = [render.preflight_job(target), render.training_job(target)]
    mixed = [Pod("rl", job["spec"]["template"]["metadata"]["labels"]) for job in jobs]
    for pool in ("sciworld", "frozen-lake"):
        server, _ = pool_pods(pool, "rl")
        for source in mixed:
            assert admits(policy(pool), source, server, "http"), (pool, source)
    server, _ = pool_pods("textarena", "rl")
    assert not any(admits(policy("textarena"), source, server, "http") for source in mixed)


PROMETHEUS = Pod(
    "monitoring",
    {"app.kubernetes.io/name": "prometheus"},
    {"team": "observability"},
)


def test_no_scraper_is_let_in_unless_the_settings_name_one() -> None:
    server, _ = pool_pods("sciworld", "rl")
    assert not admits(policy(), PROMETHEUS, server, "http")


@pytest.mark.parametrize(
    ("namespace_labels", "pod_labels"),
    [
        ({"kubernetes.io/metadata.name": "monitoring"}, {}),
        ({"team": "observability"}, {"app.kubernetes.io/name": "prometheus"}),
        ({}, {"app.kubernetes.io/name": "prometheus"}),
    ],
    ids=["namespace", "namespace-and-pod", "pod-in-any-namespace"],
)
def test_the_scrapers_the_settings_name_reach_the_metrics_port_and_no_one_else(
    namespace_labels: dict[str, str], pod_labels: dict[str, str]
) -> None:
    settings = SETTINGS.model_copy(
        update={
            "metrics_scraper_namespace_labels": namespace_labels,
            "metrics_scraper_pod_labels": pod_labels,
        }
    )
    server, _ = pool_pods("sciworld", "rl")
    scraping = policy(settings=settings)
    assert admits(scraping, PROMETHEUS, server, "http")
    # /metrics is on the session port; the admin port stays the operator's.
    assert not admits(scraping, PROMETHEUS, server, "admin")
    stranger = Pod("default", {"app": "debug-shell"}, {"team": "web"})
    assert not admits(scraping, stranger, server, "http")


def test_the_policy_names_ports_the_env_server_container_declares() -> None:
    built = builders.build_statefulset(builders.owner("sciworld", "rl", "uid"), SPEC, SETTINGS)
    (container,) = built["spec"]["template"]["spec"]["containers"]
    declared = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert declared == {"http": SPEC.port, "admin": SPEC.admin_port}
    listed = {p["port"] for rule in policy()["spec"]["ingress"] for p in rule["ports"]}
    assert listed == set(declared)
    args = container["args"]
    assert args[args.index("--admin-port") + 1] == str(SPEC.admin_port)
    # The preStop drain runs inside the pod and uses the admin port.
    assert container["lifecycle"]["preStop"]["exec"]["command"][3] == str(SPEC.admin_port)


def test_policies_are_off_unless_the_operator_knows_which_pod_it_is() -> None:
    built = builders.build_children(builders.owner("p", "rl", "uid"), SPEC, OperatorSettings())
    assert "NetworkPolicy" not in {c["kind"] for c in built}
    with pytest.raises(ValidationError, match="operator_namespace and operator_pod_labels"):
        OperatorSettings(network_policy=True)


def test_operator_pod_labels_read_as_the_chart_writes_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GYMKUBE_NETWORK_POLICY", "true")
    monkeypatch.setenv("GYMKUBE_OPERATOR_NAMESPACE", "gymkube-system")
    monkeypatch.setenv(
        "GYMKUBE_OPERATOR_POD_LABELS", "app.kubernetes.io/name=gymkube,app.kubernetes.io/instance=x"
    )
    settings = OperatorSettings()
    assert settings.operator_pod_labels == {
        "app.kubernetes.io/name": "gymkube",
        "app.kubernetes.io/instance": "x",
    }
