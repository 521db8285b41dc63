"""A CPU TrainingRun on two nodes trains for real through the GPU cluster's own controllers: Kueue
admits its RayJob (Kueue's RayJob integration), KubeRay starts a Ray head and a Ray worker from the
CPU trainer image, and verl's main_ppo trains across both Ray nodes (trainer.nnodes=2: an actor and
a vLLM server on each) against a FrozenLake pool, until the run is Succeeded with its progress in
status, read from KubeRay's submitter pod as from a one-node trainer's."""

import json
import re
import time
from typing import Any

import pytest
from e2e_cluster import (
    GROUP,
    KUEUE_API,
    VERSION,
    Cluster,
    E2ESettings,
    api_path,
    condition,
    envpool_manifest,
    finished,
    gymkube_path,
    kueue_queue,
    needs_controllers,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

RUN = "two-nodes"
STEPS = 2
# Succeeded within this after creation (images loaded, pool Ready).
TRAINING_TIMEOUT_S = 1200.0
# Each Ray node: what the e2e node (2 cores, beside the control plane and the pool) can schedule
# twice, and what Kueue's one-run quota holds with the submitter pod; the limit is above what a
# node was measured to use.
NODE_RESOURCES = {"requests": {"cpu": "200m", "memory": "2Gi"}, "limits": {"memory": "12Gi"}}
RAY_NODE_TYPE = "ray.io/node-type"
# The Ray nodes' memory high-water mark as their cgroup counts it (v2, else v1), read while the
# run trains.
MEMORY_FILES = ("memory.peak", "memory/memory.max_usage_in_bytes")


def _run(queue: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainingRun",
        "metadata": {"name": RUN},
        "spec": {
            "envPoolRef": {"name": "lake"},
            "device": "cpu",
            "nodes": 2,
            "model": {"path": "/models/SmolLM2-135M-Instruct"},
            "resources": NODE_RESOURCES,
            "shmSize": "2Gi",
            "agentLoop": {
                "maxTurns": 3,
                "maxObservationTokens": 256,
                "maxPromptTokens": 512,
                "maxResponseTokens": 512,
            },
            "dataset": {"size": 8, "valSize": 2},
            "preflight": {"enabled": False},
            "queueName": queue,
            "overrides": [
                "data.train_batch_size=2",
                "actor_rollout_ref.rollout.n=2",
                "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                "actor_rollout_ref.rollout.response_length=64",
                f"trainer.total_training_steps={STEPS}",
                "trainer.save_freq=-1",
                "trainer.test_freq=-1",
                "trainer.val_before_train=false",
            ],
        },
    }


def _ray_pods(operator: Cluster, namespace: str) -> dict[str, Any]:
    """The run's Ray nodes by node type (head, worker), Running ones only."""
    pods = operator.pods(namespace, f"{RAY_NODE_TYPE},gymkube.io/trainingrun={RUN}")
    return {
        pod["metadata"]["labels"][RAY_NODE_TYPE]: pod
        for pod in pods
        if (pod.get("status") or {}).get("phase") == "Running"
    }


def _memory_mib(operator: Cluster, namespace: str, pod: dict[str, Any]) -> int | None:
    """The pod's trainer container's cgroup memory high-water mark, MiB."""
    container = pod["spec"]["containers"][0]["name"]
    for name in MEMORY_FILES:
        text = operator.kubectl(
            "exec",
            "-n",
            namespace,
            pod["metadata"]["name"],
            "-c",
            container,
            "--",
            "cat",
            f"/sys/fs/cgroup/{name}",
            check=False,
        ).strip()
        if text.isdigit():
            return int(text) // 2**20
    return None


def _train_watching_memory(operator: Cluster, namespace: str) -> tuple[dict[str, Any], Any]:
    """Waits for the run to end, noting both Ray nodes (seen Running together) and the highest
    memory each used while it trained."""
    nodes: dict[str, Any] = {}
    peaks: dict[str, int] = {}
    deadline = time.monotonic() + TRAINING_TIMEOUT_S
    while time.monotonic() < deadline:
        run = operator.get(gymkube_path("trainingruns", namespace, RUN)) or {}
        if any(
            (condition(run, kind) or {}).get("status") == "True" for kind in ("Succeeded", "Failed")
        ):
            break
        running = _ray_pods(operator, namespace)
        if len(running) == 2:
            nodes = nodes or running
            for kind, pod in running.items():
                used = _memory_mib(operator, namespace, pod)
                if used is not None:
                    peaks[kind] = max(peaks.get(kind, 0), used)
        time.sleep(10)
    return nodes, {"memory_peak_mib": peaks}


def test_a_two_node_cpu_run_is_admitted_by_kueue_and_trains_across_both_ray_nodes(
    operator: Cluster, settings: E2ESettings, namespace: str
) -> None:
    needs_controllers(settings)
    with kueue_queue(operator, namespace) as queue:
        operator.create(
            gymkube_path("envpools", namespace),
            envpool_manifest(
                "lake",
                "frozen_lake",
                1,
                sessionsPerReplica=8,
                envConfig={"size": 2, "moves": "word"},
            ),
        )
        operator.wait_pool_ready(namespace, "lake")
        operator.create(gymkube_path("trainingruns", namespace), _run(queue))
        nodes, measured = _train_watching_memory(operator, namespace)
        run = finished(operator, "trainingruns", namespace, RUN, 60)
        print(json.dumps({"e2e_rayjob": measured}))
        status = run["status"]
        assert (condition(run, "Succeeded") or {}).get("status") == "True", status
        workloads = operator.get(api_path(KUEUE_API, "workloads", namespace)) or {}

    # The training child was a RayJob, of a head and a worker that ran side by side.
    assert status["training"]["kind"] == "RayJob", status
    assert set(nodes) == {"head", "worker"}, nodes
    # Progress as a one-node run shows it: every step, read from the submitter's log.
    progress = status["progress"]
    assert (progress["step"], progress["totalSteps"]) == (STEPS, STEPS), progress
    assert status["history"]["steps"], status
    # A vLLM server ran on each Ray node: Ray prefixes a line from another node than the driver's
    # (the head's) with that node's IP.
    submitters = operator.pods(namespace, f"batch.kubernetes.io/job-name={RUN}-train")
    assert submitters, "KubeRay's submitter pod is gone"
    log = operator.kubectl(
        "logs", "-n", namespace, submitters[0]["metadata"]["name"], "-c", "trainer"
    )
    servers = set(re.findall(r"\(vLLMHttpServer pid=\d+(?:, ip=([\d.]+))?\)", log))
    assert servers == {"", nodes["worker"]["status"]["podIP"]}, servers
    # Kueue admitted the RayJob through the LocalQueue.
    (workload,) = [
        w
        for w in workloads.get("items", [])
        if any(o["kind"] == "RayJob" for o in w["metadata"].get("ownerReferences", []))
    ]
    assert workload["spec"]["queueName"] == queue, workload
    assert workload["status"].get("admission", {}).get("clusterQueue"), workload["status"]
