"""EnvPools on a real cluster: Ready with a working pool URL, `kubectl scale`, deletion, and an
operator killed mid-reconcile."""

import json
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
from e2e_cluster import (
    ENVSERVER_PORT,
    POOL_LABEL,
    Cluster,
    E2ESettings,
    api_path,
    condition_is,
    envpool_manifest,
    envserver_selector,
    gymkube_path,
    is_ready,
    preflight_job,
    wait_until,
)

# Waits inside the tests have their own deadlines; this only bounds a test that hangs outright.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

SESSIONS_PER_REPLICA = 2  # envpool_manifest's default


def test_sciworld_pool_is_ready_and_a_preflight_job_passes_through_its_url(
    operator: Cluster, settings: E2ESettings, namespace: str
) -> None:
    start = time.monotonic()
    operator.create(
        gymkube_path("envpools", namespace), envpool_manifest("sciworld", "sciworld", 2)
    )
    pool = operator.wait_pool_ready(namespace, "sciworld")
    print(json.dumps({"envpool_apply_to_ready_s": round(time.monotonic() - start, 1)}))

    status = pool["status"]
    assert status["readyReplicas"] == 2
    assert status["capacity"] == 2 * SESSIONS_PER_REPLICA
    url = f"http://sciworld.{namespace}.svc:{ENVSERVER_PORT}"
    assert status["url"] == url
    assert len(operator.pods(namespace, envserver_selector("sciworld"))) == 2

    job = preflight_job(
        "preflight", settings.preflight_image, settings.image_pull_policy, url, "sciworld"
    )
    job_path = api_path("batch/v1", "jobs", namespace, "preflight")
    operator.create(api_path("batch/v1", "jobs", namespace), job)

    def finished() -> str | None:
        done = operator.get(job_path)
        return next((kind for kind in ("Complete", "Failed") if condition_is(done, kind)), None)

    outcome = wait_until(finished, timeout=600, what="the preflight Job to finish")
    logs = operator.kubectl("logs", "-n", namespace, "job/preflight", check=False)
    assert outcome == "Complete", f"preflight failed:\n{logs}"


def _scaled_to(replicas: int) -> Callable[[dict[str, Any]], bool]:
    def check(pool: dict[str, Any]) -> bool:
        status = pool.get("status") or {}
        return bool(status.get("replicas") == status.get("readyReplicas") == replicas)

    return check


def _has_pods(operator: Cluster, namespace: str, count: int) -> bool:
    return len(operator.pods(namespace, envserver_selector("lake"))) == count


def test_kubectl_scale_changes_replicas_and_capacity(
    operator: Cluster, namespace: str, settings: E2ESettings
) -> None:
    operator.create(gymkube_path("envpools", namespace), envpool_manifest("lake", "frozen_lake", 1))
    operator.wait_pool_ready(namespace, "lake")

    for replicas in (3, 1):
        operator.kubectl("scale", "-n", namespace, "envpool/lake", f"--replicas={replicas}")
        pool = operator.wait_pool_ready(
            namespace,
            "lake",
            extra=_scaled_to(replicas),
        )
        assert pool["status"]["capacity"] == replicas * SESSIONS_PER_REPLICA
        wait_until(
            partial(_has_pods, operator, namespace, replicas),
            timeout=settings.pod_start_timeout_s,
            what=f"{replicas} env-server pods",
        )
        scale = operator.get(gymkube_path("envpools", namespace, "lake") + "/scale")
        assert scale is not None
        assert scale["status"]["replicas"] == replicas


def _children(operator: Cluster, namespace: str, pool: str) -> dict[str, list[str]]:
    selector = f"{POOL_LABEL}={pool}"
    kinds = {
        "statefulsets": "apps/v1",
        "deployments": "apps/v1",
        "services": "v1",
        "poddisruptionbudgets": "policy/v1",
        "pods": "v1",
    }
    return {
        plural: operator.names(api_path(api, plural, namespace), selector)
        for plural, api in kinds.items()
    }


def _assert_one_of_each(children: dict[str, list[str]]) -> None:
    assert children["statefulsets"] == ["lake"]
    assert children["deployments"] == ["lake-router"]
    assert children["services"] == ["lake", "lake-backends"]
    assert len(children["poddisruptionbudgets"]) <= 1


def test_deleting_a_pool_removes_every_child(operator: Cluster, namespace: str) -> None:
    operator.create(gymkube_path("envpools", namespace), envpool_manifest("lake", "frozen_lake", 2))
    operator.wait_pool_ready(namespace, "lake")
    _assert_one_of_each(_children(operator, namespace, "lake"))

    pool_path = gymkube_path("envpools", namespace, "lake")
    operator.delete(pool_path)
    wait_until(lambda: operator.get(pool_path) is None, timeout=120, what="the EnvPool to go")
    wait_until(
        lambda: not any(_children(operator, namespace, "lake").values()),
        timeout=180,
        what="every child of the deleted pool to be garbage-collected",
    )


def test_killing_the_operator_mid_reconcile_leaves_no_duplicates(
    operator: Cluster, settings: E2ESettings, namespace: str
) -> None:
    selector = f"app.kubernetes.io/instance={settings.release}"
    old = {p["metadata"]["name"] for p in operator.pods(settings.operator_namespace, selector)}
    assert old, "no operator pod"
    operator.create(gymkube_path("envpools", namespace), envpool_manifest("lake", "frozen_lake", 2))
    # Kill it as soon as it starts making children: the pool is then half-reconciled.
    wait_until(
        lambda: any(_children(operator, namespace, "lake").values()),
        timeout=60,
        what="the operator to start creating children",
        interval=0.1,
    )
    for name in old:
        operator.delete(
            api_path("v1", "pods", settings.operator_namespace, name), grace_period_seconds=0
        )

    def replacement_ready() -> bool:
        pods = operator.pods(settings.operator_namespace, selector)
        return any(p["metadata"]["name"] not in old and is_ready(p) for p in pods)

    wait_until(replacement_ready, timeout=180, what="a new operator pod to be Ready")
    operator.wait_pool_ready(namespace, "lake")
    _assert_one_of_each(_children(operator, namespace, "lake"))
    assert len(operator.pods(namespace, envserver_selector("lake"))) == 2
