"""A one-node TrainingRun on a real cluster without GPUs: it waits for its pool, passes the CPU
preflight, and creates the GPU Job, which stays Pending (asserted on spec and conditions)."""

import json
from typing import Any

import pytest
from e2e_cluster import (
    GROUP,
    VERSION,
    Cluster,
    E2ESettings,
    api_path,
    condition,
    condition_is,
    envpool_manifest,
    gymkube_path,
    wait_until,
)

# Waits inside the tests have their own deadlines; this only bounds a test that hangs outright.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

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
    operator.create(gymkube_path("trainingruns", namespace), _trainingrun("grpo", "lake"))
    waiting = operator.wait_condition(
        namespace, "trainingruns", "grpo", "EnvPoolReady", status="False", timeout=120
    )
    assert waiting["status"].get("training") is None, "training started before its pool existed"
    assert operator.names(api_path("batch/v1", "jobs", namespace)) == []

    operator.create(gymkube_path("envpools", namespace), envpool_manifest("lake", "frozen_lake", 1))
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

    job = operator.get(api_path("batch/v1", "jobs", namespace, child["name"]))
    assert job is not None, f"the training Job {child['name']} does not exist"
    spec = job["spec"]
    assert spec.get("backoffLimit") == 0
    assert spec.get("activeDeadlineSeconds") == 3600
    assert spec.get("parallelism", 1) == 1
    assert spec.get("completions", 1) == 1
    owners = [(o["kind"], o["name"]) for o in job["metadata"].get("ownerReferences", [])]
    assert ("TrainingRun", "grpo") in owners
    containers = spec["template"]["spec"]["containers"]
    gpus = [c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu") for c in containers]
    assert str(GPUS) in gpus, f"no container asks for {GPUS} GPUs: {gpus}"
    assert status["envPoolUrl"] in json.dumps(spec["template"]), (
        "the Job does not point the agent loop at the pool"
    )

    def unschedulable() -> bool:
        pods = operator.pods(namespace, f"job-name={child['name']}")
        return any(
            c.get("type") == "PodScheduled"
            and c.get("status") == "False"
            and c.get("reason") == "Unschedulable"
            for p in pods
            for c in (p.get("status") or {}).get("conditions") or []
        )

    wait_until(unschedulable, timeout=120, what="the GPU pod to be reported Unschedulable")

    def says_why() -> Any:
        run = operator.get(gymkube_path("trainingruns", namespace, "grpo")) or {}
        message = (condition(run, "Running") or {}).get("message", "")
        return run if "cannot start: unschedulable" in message and "gpu" in message else None

    # The run itself says why it waits, in the scheduler's words (the next reconcile, within
    # the operator's resync period).
    final = wait_until(says_why, timeout=120, what="the run to say its pod is unschedulable")
    assert final["status"]["phase"] == "Starting"
    assert not condition_is(final, "Succeeded")
    assert not condition_is(final, "Failed")
