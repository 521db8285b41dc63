"""The EnvPool operator against a real API server: validation, children, scale, updates, GC."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from controlplane import ControlPlane
from gymkube_operator.envpool.builders import GRACE_AFTER_DRAIN
from operator_support import (
    Cluster,
    OperatorProcess,
    envpool,
    eventually,
    install_crds,
    running_operator,
)

pytestmark = pytest.mark.integration

CHILDREN = {
    ("StatefulSet", "{0}"),
    ("Service", "{0}-backends"),
    ("Deployment", "{0}-router"),
    ("Service", "{0}"),
    ("PodDisruptionBudget", "{0}"),
}


def expected_children(pool: str) -> set[tuple[str, str]]:
    return {(kind, name.format(pool)) for kind, name in CHILDREN}


@pytest.fixture(scope="module")
def crds(kube: ControlPlane) -> None:
    install_crds(kube)


@pytest.fixture
def cluster(kube: ControlPlane, namespace: str, crds: None) -> Iterator[Cluster]:
    with kube.api_client() as client:
        yield Cluster(client, namespace)


# `operator` is conftest's, on this module's `cluster`.


def apply(kube: ControlPlane, namespace: str, body: dict[str, Any]) -> tuple[int, str]:
    result = kube.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(body), check=False)
    return result.returncode, result.stderr


INVALID: list[tuple[str, dict[str, Any], str]] = [
    ("no env", {"replicas": 1}, "spec.env: Required value"),
    ("unknown env", {"env": "doom"}, "env must be sciworld, frozen_lake, textarena:<GameId>"),
    (
        "more warm than capacity",
        {"sessionsPerReplica": 4, "warmSessionsPerReplica": 8},
        "warmSessionsPerReplica must not exceed sessionsPerReplica",
    ),
    ("negative replicas", {"replicas": -1}, "spec.replicas: Invalid value: -1"),
    ("replicas as words", {"replicas": "four"}, 'spec.replicas: Invalid value: "string"'),
    ("privileged port", {"port": 80}, "should be greater than or equal to 1024"),
    ("admin port is the session port", {"adminPort": 8000}, "adminPort must differ from port"),
    ("openenv without an image", {"env": "openenv"}, "env openenv runs your OpenEnv server image"),
    ("no sessions", {"sessionsPerReplica": 0}, "should be greater than or equal to 1"),
    (
        "probe timeout too long",
        {"watchdog": {"probePeriodSeconds": 2, "probeTimeoutSeconds": 5}},
        "watchdog.probeTimeoutSeconds must be shorter than watchdog.probePeriodSeconds",
    ),
    (
        "bad quantity",
        {"resources": {"limits": {"memory": "lots"}}},
        "spec.resources.limits.memory in body should match",
    ),
    ("empty image", {"image": ""}, "spec.image: Invalid value"),
    ("typo in a field", {"sessionPerReplica": 4}, 'unknown field "spec.sessionPerReplica"'),
    ("too many routers", {"router": {"replicas": 500}}, "should be less than or equal to 100"),
    (
        "no router",
        {"router": {"replicas": 0}},
        "spec.router.replicas: Invalid value: 0: spec.router.replicas in body should be greater "
        "than or equal to 1",
    ),
    (
        "too many sessions",
        {"sessionsPerReplica": 5000},
        "spec.sessionsPerReplica: Invalid value: 5000",
    ),
    (
        "too many warm sessions",
        {"sessionsPerReplica": 4096, "warmSessionsPerReplica": 5000},
        "spec.warmSessionsPerReplica: Invalid value: 5000",
    ),
    ("too many replicas", {"replicas": 5000}, "spec.replicas: Invalid value: 5000"),
    (
        "recycle after a century",
        {"watchdog": {"maxAgeSeconds": 3_153_600_000}},
        "spec.watchdog.maxAgeSeconds: Invalid value",
    ),
    ("zero unavailable", {"watchdog": {"maxUnavailable": 0}}, "spec.watchdog.maxUnavailable"),
]


@pytest.mark.parametrize(("case", "spec", "message"), INVALID, ids=[c[0] for c in INVALID])
def test_invalid_pools_are_rejected_with_a_readable_message(
    kube: ControlPlane, cluster: Cluster, case: str, spec: dict[str, Any], message: str
) -> None:
    body = envpool("pool", **spec)
    if "env" not in spec and case == "no env":
        del body["spec"]["env"]
    code, stderr = apply(kube, cluster.namespace, body)
    assert code != 0, f"{case}: accepted"
    assert message in stderr
    assert cluster.get("pool") is None


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("p" * 41, "EnvPool names are at most 40 characters"),
        ("1pool", "EnvPool names must start with a letter"),
    ],
)
def test_invalid_pool_names_are_rejected(
    kube: ControlPlane, cluster: Cluster, name: str, message: str
) -> None:
    code, stderr = apply(kube, cluster.namespace, envpool(name))
    assert code != 0
    assert message in stderr


def test_defaults_are_filled_in_by_the_api_server(cluster: Cluster) -> None:
    created = cluster.create(envpool("defaults"))
    spec = created["spec"]
    assert spec["replicas"] == 1
    assert spec["sessionsPerReplica"] == 16
    assert spec["watchdog"]["probePeriodSeconds"] == 5
    assert spec["router"]["replicas"] == 1
    assert spec["suspend"] is False
    cluster.custom.delete_namespaced_custom_object(
        "gymkube.io", "v1alpha1", cluster.namespace, "envpools", "defaults"
    )


def test_a_valid_pool_gets_exactly_its_children_with_owner_references(
    kube: ControlPlane, cluster: Cluster, operator: OperatorProcess
) -> None:
    uid = cluster.create(envpool("lake", replicas=2, sessionsPerReplica=8))["metadata"]["uid"]
    pool = eventually("first reconcile", lambda: cluster.reconciled("lake"))
    children = cluster.children("lake")
    assert set(children) == expected_children("lake")
    for child in children.values():
        (ref,) = child.metadata.owner_references
        assert (ref.kind, ref.name, ref.uid, ref.controller) == ("EnvPool", "lake", uid, True)
    status = pool["status"]
    assert status["url"] == f"http://lake.{cluster.namespace}.svc:8000"
    conditions = {c["type"]: c for c in status["conditions"]}
    assert set(conditions) == {"Ready", "Progressing", "Degraded"}
    assert conditions["Ready"]["status"] == "False"
    assert conditions["Degraded"]["status"] == "False"
    # Printer columns and the short name work for users.
    table = kube.kubectl("get", "envp", "-n", cluster.namespace).stdout
    assert table.split()[:7] == ["NAME", "READY", "SESSIONS", "CAPACITY", "HEALTH", "URL", "AGE"]
    assert status["url"] in table


def test_pool_becomes_ready_when_its_pods_are_ready(
    kube: ControlPlane, cluster: Cluster, operator: OperatorProcess
) -> None:
    cluster.create(envpool("ready", replicas=2, sessionsPerReplica=4))
    eventually("first reconcile", lambda: cluster.reconciled("ready"))

    def all_pods_marked() -> bool | None:
        marked = cluster.mark_pods_ready("gymkube.io/envpool=ready")
        return True if marked == 3 else None  # two env servers and one router

    eventually("pods created by the StatefulSet and Deployment controllers", all_pods_marked)
    kube.kubectl(
        "wait", "-n", cluster.namespace, "--for=condition=Ready", "envpool/ready", "--timeout=60s"
    )
    status = eventually("capacity in status", lambda: _status_with(cluster, "ready", capacity=8))
    assert status["readyReplicas"] == 2

    # The operator's /metrics count it: the pool Ready and healthy, its passes, its API requests.
    pools = (
        "gymkube_operator_envpools",
        (("degraded", "Healthy"), ("kind", "EnvPool"), ("ready", "true")),
    )
    metrics = eventually(
        "the Ready pool in /metrics", lambda: (m := operator.metrics()).get(pools) and m
    )
    assert metrics[pools] == 1
    ok = ("gymkube_operator_reconciles_total", (("kind", "EnvPool"), ("result", "ok")))
    assert metrics[ok] >= 1
    applied = ("gymkube_operator_api_requests_total", (("code", "200"), ("method", "PATCH")))
    assert metrics[applied] >= 1


def _status_with(cluster: Cluster, name: str, **fields: Any) -> dict[str, Any] | None:
    pool = cluster.get(name) or {}
    status: dict[str, Any] = pool.get("status", {})
    return status if all(status.get(k) == v for k, v in fields.items()) else None


def test_kubectl_scale_changes_the_number_of_env_servers(
    kube: ControlPlane, cluster: Cluster, operator: OperatorProcess
) -> None:
    cluster.create(envpool("scaled", replicas=1))
    eventually("first reconcile", lambda: cluster.reconciled("scaled"))
    kube.kubectl("scale", "-n", cluster.namespace, "envpool/scaled", "--replicas=3")

    def scaled() -> bool | None:
        sts = cluster.apps.read_namespaced_stateful_set("scaled", cluster.namespace)
        return True if sts.spec.replicas == 3 else None

    eventually("StatefulSet scaled to 3", scaled)
    eventually("status.replicas follows", lambda: _status_with(cluster, "scaled", replicas=3))
    # The scale subresource reports what exists, through the same selector the pods carry.
    scale = json.loads(
        kube.kubectl("get", "--raw", _scale_path(cluster.namespace, "scaled")).stdout
    )
    assert scale["status"]["selector"] == (
        "gymkube.io/envpool=scaled,app.kubernetes.io/component=envserver"
    )


def _scale_path(namespace: str, name: str) -> str:
    return f"/apis/gymkube.io/v1alpha1/namespaces/{namespace}/envpools/{name}/scale"


def test_a_spec_change_updates_the_children(cluster: Cluster, operator: OperatorProcess) -> None:
    cluster.create(envpool("changing", image="reg/envserver:1"))
    eventually("first reconcile", lambda: cluster.reconciled("changing"))
    cluster.patch(
        "changing",
        {
            "image": "reg/envserver:2",
            "sessionsPerReplica": 32,
            "envConfig": {"size": 2, "moves": "word"},
            "router": {"replicas": 2},
        },
    )
    eventually("second reconcile", lambda: cluster.reconciled("changing", generation=2))
    sts = cluster.apps.read_namespaced_stateful_set("changing", cluster.namespace)
    container = sts.spec.template.spec.containers[0]
    assert container.image == "reg/envserver:2"
    assert container.args[container.args.index("--max-sessions") + 1] == "32"
    assert container.args[container.args.index("--env-config") + 1] == '{"moves":"word","size":2}'
    router = cluster.apps.read_namespaced_deployment("changing-router", cluster.namespace)
    assert router.spec.replicas == 2
    assert set(cluster.children("changing")) == expected_children("changing")


def test_suspend_scales_to_zero_and_keeps_the_pool(
    cluster: Cluster, operator: OperatorProcess
) -> None:
    cluster.create(envpool("paused", replicas=2))
    eventually("first reconcile", lambda: cluster.reconciled("paused"))
    cluster.patch("paused", {"suspend": True})
    pool = eventually("suspended", lambda: cluster.reconciled("paused", generation=2))
    sts = cluster.apps.read_namespaced_stateful_set("paused", cluster.namespace)
    router = cluster.apps.read_namespaced_deployment("paused-router", cluster.namespace)
    assert (sts.spec.replicas, router.spec.replicas) == (0, 0)
    ready = next(c for c in pool["status"]["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "Suspended")
    assert pool["spec"]["replicas"] == 2


def test_deleting_the_pool_garbage_collects_its_children(
    cluster: Cluster, operator: OperatorProcess
) -> None:
    cluster.create(envpool("doomed"))
    eventually("first reconcile", lambda: cluster.reconciled("doomed"))
    assert set(cluster.children("doomed")) == expected_children("doomed")
    cluster.custom.delete_namespaced_custom_object(
        "gymkube.io", "v1alpha1", cluster.namespace, "envpools", "doomed"
    )
    eventually("pool gone", lambda: True if cluster.get("doomed") is None else None)
    eventually("children collected", lambda: True if not cluster.children("doomed") else None)


def test_a_deleted_pools_servers_stop_without_waiting_out_their_drain(
    cluster: Cluster, operator: OperatorProcess
) -> None:
    # The servers' own grace covers a drain of drainTimeoutSeconds; a deleted pool's sessions can
    # no longer be reached, so its servers get only the time a drained server has to stop.
    cluster.create(envpool("ending", replicas=2, watchdog={"drainTimeoutSeconds": 600}))
    selector = "gymkube.io/envpool=ending,app.kubernetes.io/component=envserver"
    eventually(
        "both env-server pods bound to a node",
        lambda: True if cluster.bind_pods(selector) == 2 else None,
    )
    (pod, _) = cluster.core.list_namespaced_pod(cluster.namespace, label_selector=selector).items
    assert pod.spec.termination_grace_period_seconds == 600 + GRACE_AFTER_DRAIN
    cluster.custom.delete_namespaced_custom_object(
        "gymkube.io", "v1alpha1", cluster.namespace, "envpools", "ending"
    )

    def stopping() -> list[Any] | None:
        pods = cluster.core.list_namespaced_pod(cluster.namespace, label_selector=selector).items
        graces = [p.metadata.deletion_grace_period_seconds for p in pods]
        return pods if len(pods) == 2 and graces == [GRACE_AFTER_DRAIN] * 2 else None

    stopped = eventually("both servers stopping within the short grace", stopping)
    # Not replaced: the StatefulSet went first.
    assert {p.metadata.uid for p in stopped} == {
        p.metadata.uid
        for p in cluster.core.list_namespaced_pod(cluster.namespace, label_selector=selector).items
    }
    eventually("pool gone", lambda: True if cluster.get("ending") is None else None)
    reasons = [e.reason for e in cluster.events("ending")]
    assert "ServersStopped" in reasons, reasons
    for p in stopped:  # no kubelet here to finish the stop
        cluster.core.delete_namespaced_pod(
            p.metadata.name, cluster.namespace, grace_period_seconds=0
        )


def test_restarting_the_operator_mid_reconcile_creates_no_duplicates(
    kube: ControlPlane, cluster: Cluster, tmp_path: Path
) -> None:
    names = [f"pool-{i}" for i in range(15)]
    first = OperatorProcess(kube, cluster.namespace, tmp_path / "first.log")
    try:
        for name in names:
            cluster.create(envpool(name))
        # Kill it as soon as it started writing children, mid-way through the batch.
        eventually("some children", lambda: True if cluster.children("pool-0") else None)
    finally:
        first.kill()
    with running_operator(kube, cluster, tmp_path / "second.log"):
        for name in names:
            eventually(f"{name} reconciled", lambda n=name: cluster.reconciled(n))  # type: ignore[misc]
            assert set(cluster.children(name)) == expected_children(name)
        statefulsets = cluster.apps.list_namespaced_stateful_set(cluster.namespace).items
        assert sorted(s.metadata.name for s in statefulsets) == sorted(names)


def test_pod_template_the_api_server_refuses_marks_the_pool_degraded(
    cluster: Cluster, operator: OperatorProcess
) -> None:
    cluster.create(envpool("odd", podTemplate={"nodeSelector": "cpu-pool"}))

    def degraded() -> dict[str, Any] | None:
        status = (cluster.get("odd") or {}).get("status", {})
        found = [c for c in status.get("conditions", []) if c["type"] == "Degraded"]
        return found[0] if found and found[0]["status"] == "True" else None

    condition = eventually("Degraded condition", degraded)
    assert condition["reason"] == "ApplyFailed"
    assert "nodeSelector" in condition["message"]
    eventually(
        "an ApplyFailed event",
        lambda: True if any(e.reason == "ApplyFailed" for e in cluster.events("odd")) else None,
    )


SERVER_ERROR = (
    "gymkube-envserver: unknown TextArena game 'NoSuchGame-v0': "
    "Environment NoSuchGame-v0 not found in registry."
)
KILLED_RUN = {"startedAt": "2026-05-01T12:00:00Z", "finishedAt": "2026-05-01T12:05:02Z"}
STARTUP_FAILED = 'Startup probe failed: Get "http://10.0.0.5:8000/healthz": connection refused'
# (pool, env, what the kubelet or scheduler writes on its pod, reason, words in the message)
STUCK_PODS: list[tuple[str, str, dict[str, Any], str, str]] = [
    (
        "crash",
        "textarena:NoSuchGame-v0",
        {
            "restartCount": 3,
            "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}},
            "lastState": {
                "terminated": {
                    "exitCode": 2,
                    "reason": "Error",
                    "message": f"starting\n{SERVER_ERROR}\n",
                }
            },
        },
        "ServerCrashLoop",
        f"pod crash-0: exited with code 2, 3 restarts: {SERVER_ERROR}",
    ),
    (
        "pull",
        "frozen_lake",
        {
            "state": {
                "waiting": {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "x"'}
            }
        },
        "ImagePullFailed",
        'cannot pull image reg.example/envserver:nope: Back-off pulling image "x"',
    ),
    (
        "oom",
        "frozen_lake",
        {
            "restartCount": 1,
            "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}},
        },
        "OutOfMemory",
        "killed for memory (OOMKilled) at its memory limit of 64Mi",
    ),
    ("unschedulable", "frozen_lake", {}, "Unschedulable", "0/3 nodes are available"),
    (
        "secret",
        "frozen_lake",
        {
            "state": {
                "waiting": {
                    "reason": "CreateContainerConfigError",
                    "message": 'secret "tokens" not found',
                }
            }
        },
        "ContainerCreateFailed",
        'pod secret-0: CreateContainerConfigError: secret "tokens" not found',
    ),
    (
        "startup",
        "frozen_lake",
        {
            "restartCount": 1,
            "state": {"running": {"startedAt": "2026-05-01T12:05:03Z"}},
            "lastState": {"terminated": {"exitCode": 137, "reason": "Error", **KILLED_RUN}},
        },
        "StartupProbeFailing",
        f"restarted 1 times for failing its startup probe: {STARTUP_FAILED}",
    ),
]


def _play_kubelet(cluster: Cluster, pool: str, container: dict[str, Any]) -> None:
    """Write on the pool's pod what a kubelet (or, with no container, the scheduler) would."""
    name = f"{pool}-0"
    pod = eventually(f"pod {name}", lambda: _pod(cluster, name))
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if not container:
        message = "0/3 nodes are available: 3 Insufficient memory."
        unscheduled = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
        status = {"conditions": [{**unscheduled, "message": message, "lastTransitionTime": now}]}
        cluster.core.patch_namespaced_pod_status(name, cluster.namespace, {"status": status})
    else:
        cluster.report_container(name, container)
    if pool == "startup":
        for reason, said, at in (
            ("Unhealthy", STARTUP_FAILED, "2026-05-01T12:04:55Z"),
            (
                "Killing",
                "Container envserver failed startup probe, will be restarted",
                "2026-05-01T12:05:00Z",
            ),
        ):
            cluster.core.create_namespaced_event(
                cluster.namespace,
                {
                    "metadata": {"generateName": f"{name}."},
                    "involvedObject": {
                        "kind": "Pod",
                        "namespace": cluster.namespace,
                        "name": name,
                        "uid": pod.metadata.uid,
                        "fieldPath": "spec.containers{envserver}",
                    },
                    "reason": reason,
                    "message": said,
                    "type": "Warning",
                    "firstTimestamp": at,
                    "lastTimestamp": at,
                    "source": {"component": "kubelet"},
                },
            )


def _pod(cluster: Cluster, name: str) -> Any:
    found = cluster.core.list_namespaced_pod(
        cluster.namespace, field_selector=f"metadata.name={name}"
    ).items
    return found[0] if found else None


def _degraded(cluster: Cluster, pool: str) -> dict[str, Any] | None:
    status = (cluster.get(pool) or {}).get("status", {})
    found = [c for c in status.get("conditions", []) if c["type"] == "Degraded"]
    return found[0] if found and found[0]["status"] == "True" else None


def test_pods_that_cannot_come_up_mark_the_pool_degraded_with_their_cause(
    kube: ControlPlane, cluster: Cluster, operator: OperatorProcess
) -> None:
    period = 2
    watchdog = {"probePeriodSeconds": period, "probeTimeoutSeconds": 1}
    for pool, env, _, _, _ in STUCK_PODS:
        cluster.create(
            envpool(
                pool,
                env=env,
                image="reg.example/envserver:nope",
                resources={"limits": {"memory": "64Mi"}},
                watchdog=watchdog,
            )
        )
    for pool, _, _, _, _ in STUCK_PODS:
        eventually(f"{pool} reconciled", lambda p=pool: cluster.reconciled(p))  # type: ignore[misc]
        assert _degraded(cluster, pool) is None
    for pool, _, container, reason, message in STUCK_PODS:
        written = time.monotonic()
        _play_kubelet(cluster, pool, container)
        degraded = eventually(
            f"{pool} Degraded",
            lambda p=pool: _degraded(cluster, p),
            timeout=period + 10,  # type: ignore[misc]
        )
        assert (degraded["reason"], pool) == (reason, pool)
        assert message in degraded["message"]
        # Within one watchdog period of the evidence (plus the watch event and the write).
        assert time.monotonic() - written < period + 3
        assert degraded["observedGeneration"] == 1
    table = kube.kubectl("get", "envp", "-n", cluster.namespace, "crash", "startup").stdout
    assert [line.split()[4] for line in table.splitlines()[1:]] == [
        "ServerCrashLoop",
        "StartupProbeFailing",
    ]
    eventually(
        "a ServerCrashLoop Warning event",
        lambda: (
            True if any(e.reason == "ServerCrashLoop" for e in cluster.events("crash")) else None
        ),
    )
