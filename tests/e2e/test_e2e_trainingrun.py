"""A one-node TrainingRun on a real cluster without GPUs: it waits for its pool, passes the CPU
preflight, and creates the GPU Job, which stays Pending (asserted on spec and conditions)."""

from typing import Any

import pytest
from e2e_cluster import (
    GROUP,
    VERSION,
    Cluster,
    E2ESettings,
    condition_is,
    envpool_manifest,
    wait_until,
)

pytestmark = pytest.mark.e2e

GPUS = 2


def _trainingrun(name: str, pool: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainingRun",
        "metadata": {"name": name},
        "spec": {
            "envPoolRef": {"name": pool},
            "model": {"path": "/models/tiny-policy"},
            "nodes": 1,
            "gpusPerNode": GPUS,
            "dataset": {"size": 8, "valSize": 4},
            "preflight": {"episodes": 2, "policy": "scripted"},
            "backoffLimit": 0,
            "activeDeadlineSeconds": 3600,
        },
    }


def test_one_node_run_waits_for_its_pool_passes_preflight_and_creates_the_gpu_job(
    operator: Cluster, settings: E2ESettings, namespace: str
) -> None:
    operator.apply_custom(namespace, "trainingruns", _trainingrun("grpo", "lake"))
    waiting = operator.wait_condition(
        namespace, "trainingruns", "grpo", "EnvPoolReady", status="False", timeout=120
    )
    assert waiting["status"].get("training") is None, "training started before its pool existed"
    assert operator.batch.list_namespaced_job(namespace).items == []

    operator.apply_custom(namespace, "envpools", envpool_manifest("lake", "frozen_lake", 1))
    run = operator.wait_condition(
        namespace,
        "trainingruns",
        "grpo",
        "PreflightPassed",
        timeout=settings.pool_ready_timeout_s + 600,
        extra=lambda obj: bool((obj.get("status") or {}).get("training")),
    )
    status = run["status"]
    assert condition_is(run, "EnvPoolReady")
    assert status["preflight"]["passed"] is True
    assert status["envPoolUrl"] == f"http://lake.{namespace}.svc:8000"
    child = status["training"]
    assert (child["apiVersion"], child["kind"]) == ("batch/v1", "Job")

    job = operator.batch.read_namespaced_job(child["name"], namespace)
    assert job.spec.backoff_limit == 0
    assert job.spec.active_deadline_seconds == 3600
    assert (job.spec.parallelism or 1) == 1
    assert (job.spec.completions or 1) == 1
    owners = [(o.kind, o.name) for o in job.metadata.owner_references or []]
    assert ("TrainingRun", "grpo") in owners
    gpu_requests = [
        (c.resources.limits or {}).get("nvidia.com/gpu") for c in job.spec.template.spec.containers
    ]
    assert str(GPUS) in gpu_requests, f"no container asks for {GPUS} GPUs: {gpu_requests}"
    rendered = str(job.spec.template.spec.to_dict())
    assert status["envPoolUrl"] in rendered, "the Job does not point the agent loop at the pool"

    def unschedulable() -> bool:
        pods = operator.core.list_namespaced_pod(
            namespace, label_selector=f"job-name={child['name']}"
        )
        return any(
            c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
            for p in pods.items
            for c in p.status.conditions or []
        )

    wait_until(unschedulable, timeout=120, what="the GPU pod to be reported Unschedulable")
    run = operator.get_custom(namespace, "trainingruns", "grpo")
    assert not condition_is(run, "Succeeded")
    assert not condition_is(run, "Failed")
