"""EnvPools on a real cluster: Ready with a working pool URL, `kubectl scale`, and deletion."""

import json
import time

import pytest
from e2e_cluster import (
    ENVSERVER_PORT,
    POOL_LABEL,
    Cluster,
    E2ESettings,
    envpool_manifest,
    envserver_selector,
    preflight_job,
    wait_until,
)
from kubernetes.client.exceptions import ApiException

pytestmark = pytest.mark.e2e


def test_sciworld_pool_is_ready_and_a_preflight_job_passes_through_its_url(
    operator: Cluster, settings: E2ESettings, namespace: str
) -> None:
    start = time.monotonic()
    operator.apply_custom(namespace, "envpools", envpool_manifest("sciworld", "sciworld", 2))
    pool = operator.wait_pool_ready(namespace, "sciworld")
    print(json.dumps({"envpool_apply_to_ready_s": round(time.monotonic() - start, 1)}))

    status = pool["status"]
    assert status["readyReplicas"] == 2
    assert status["capacity"] == 2 * 2
    url = f"http://sciworld.{namespace}.svc:{ENVSERVER_PORT}"
    assert status["url"] == url
    assert len(operator.pods(namespace, envserver_selector("sciworld"))) == 2

    job = preflight_job(
        "preflight", settings.preflight_image, settings.image_pull_policy, url, "sciworld"
    )
    operator.batch.create_namespaced_job(namespace, job)

    def finished() -> str | None:
        conditions = operator.batch.read_namespaced_job("preflight", namespace).status.conditions
        done = [c.type for c in conditions or [] if c.status == "True"]
        return next((t for t in done if t in ("Complete", "Failed")), None)

    outcome = wait_until(finished, timeout=600, what="the preflight Job to finish")
    logs = operator.kubectl("logs", "-n", namespace, "job/preflight", check=False)
    assert outcome == "Complete", f"preflight failed:\n{logs}"


def test_kubectl_scale_changes_replicas_and_capacity(
    operator: Cluster, settings: E2ESettings, namespace: str
) -> None:
    operator.apply_custom(namespace, "envpools", envpool_manifest("lake", "frozen_lake", 1))
    operator.wait_condition(
        namespace, "envpools", "lake", "Ready", timeout=settings.pool_ready_timeout_s
    )

    for replicas in (3, 1):
        operator.kubectl("scale", "-n", namespace, "envpool/lake", f"--replicas={replicas}")
        pool = operator.wait_pool_ready(
            namespace,
            "lake",
            extra=lambda obj, n=replicas: (
                obj["status"].get("readyReplicas") == n and obj["status"].get("replicas") == n
            ),
        )
        assert pool["status"]["capacity"] == replicas * 2
        wait_until(
            lambda n=replicas: len(operator.pods(namespace, envserver_selector("lake"))) == n,
            timeout=settings.pod_start_timeout_s,
            what=f"{replicas} env-server pods",
        )
        scale = operator.custom.get_namespaced_custom_object_scale(
            "gymkube.io", "v1alpha1", namespace, "envpools", "lake"
        )
        assert scale["status"]["replicas"] == replicas


def _children(operator: Cluster, namespace: str, pool: str) -> dict[str, list[str]]:
    selector = f"{POOL_LABEL}={pool}"
    return {
        "statefulsets": [
            o.metadata.name
            for o in operator.apps.list_namespaced_stateful_set(
                namespace, label_selector=selector
            ).items
        ],
        "deployments": [
            o.metadata.name
            for o in operator.apps.list_namespaced_deployment(
                namespace, label_selector=selector
            ).items
        ],
        "services": [
            o.metadata.name
            for o in operator.core.list_namespaced_service(namespace, label_selector=selector).items
        ],
        "poddisruptionbudgets": [
            o.metadata.name
            for o in operator.policy.list_namespaced_pod_disruption_budget(
                namespace, label_selector=selector
            ).items
        ],
        "pods": [o.metadata.name for o in operator.pods(namespace, selector)],
    }


def test_deleting_a_pool_removes_every_child(
    operator: Cluster, settings: E2ESettings, namespace: str
) -> None:
    operator.apply_custom(namespace, "envpools", envpool_manifest("lake", "frozen_lake", 2))
    operator.wait_condition(
        namespace, "envpools", "lake", "Ready", timeout=settings.pool_ready_timeout_s
    )
    children = _children(operator, namespace, "lake")
    assert children["statefulsets"] == ["lake"]
    assert children["deployments"] == ["lake-router"]
    assert sorted(children["services"]) == ["lake", "lake-backends"]

    operator.delete_custom(namespace, "envpools", "lake")
    wait_until(
        lambda: operator.get_custom(namespace, "envpools", "lake") is None,
        timeout=120,
        what="the EnvPool to be deleted",
    )
    wait_until(
        lambda: not any(_children(operator, namespace, "lake").values()),
        timeout=180,
        what="every child of the deleted pool to be garbage-collected",
    )


def test_killing_the_operator_mid_reconcile_leaves_no_duplicates(
    operator: Cluster, settings: E2ESettings, namespace: str
) -> None:
    operator.apply_custom(namespace, "envpools", envpool_manifest("lake", "frozen_lake", 2))
    selector = f"app.kubernetes.io/instance={settings.release}"
    old = operator.pods(settings.operator_namespace, selector)
    assert old, "no operator pod"
    # Kill it as soon as it starts making children: the pool is then half-reconciled.
    wait_until(
        lambda: any(_children(operator, namespace, "lake").values()),
        timeout=60,
        what="the operator to start creating children",
        interval=0.1,
    )
    for pod in old:
        operator.core.delete_namespaced_pod(
            pod.metadata.name, settings.operator_namespace, grace_period_seconds=0
        )
    old_names = {p.metadata.name for p in old}

    def replacement_ready() -> bool:
        pods = operator.pods(settings.operator_namespace, selector)
        return any(
            p.metadata.name not in old_names
            and operator.pod_ready(settings.operator_namespace, p.metadata.name)
            for p in pods
        )

    wait_until(replacement_ready, timeout=180, what="a new operator pod to be Ready")
    operator.wait_condition(
        namespace, "envpools", "lake", "Ready", timeout=settings.pool_ready_timeout_s
    )
    children = _children(operator, namespace, "lake")
    assert children["statefulsets"] == ["lake"]
    assert children["deployments"] == ["lake-router"]
    assert sorted(children["services"]) == ["lake", "lake-backends"]
    assert len(children["poddisruptionbudgets"]) <= 1
    assert len(operator.pods(namespace, envserver_selector("lake"))) == 2
    try:
        operator.core.read_namespace(namespace)
    except ApiException as err:  # the namespace must survive the operator restart untouched
        raise AssertionError(f"namespace vanished: {err}") from err
