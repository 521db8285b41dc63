"""CPU TrainingRuns beyond one pool, one node and gymkube's loop, as a user writes them, queued in a
real Kueue: the mixed-pools example over a FrozenLake and a TextArena pool, whose per-pool figures
are each pool's own episode counts, and the custom-agent-loop example on two nodes, a user's loop
from a ConfigMap whose rewards are the pool's own scores, on a pool that starts at zero, grows for
the run's demand and returns to zero after it. Both go to one LocalQueue whose quota holds one run:
the second waits, says why in Kueue's words, and trains once the first is done. The second is a
RayJob that Kueue admits (its RayJob integration): KubeRay starts a Ray head and a Ray worker from
the CPU trainer image, each with the user's loop mounted, and verl trains across both (a vLLM
server on each), its progress read from KubeRay's submitter pod as from a one-node trainer's. Each
trains a step or two of SmolLM2-135M on the CPU trainer image."""

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_cluster import (
    KUEUE_API,
    Cluster,
    E2ESettings,
    api_path,
    condition,
    finished,
    gymkube_path,
    kueue_queue,
    needs_controllers,
    pool_counts,
    pool_restarts,
    suspended_while_queued,
    wait_until,
)
from gymkube_agentloop.train import PROGRESS_PREFIX

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
# Succeeded within this after creation (images loaded, pools Ready).
TRAINING_TIMEOUT_S = 1200.0
# What a CI node can hold beside the pools: the examples ask for a larger one.
SMALL_TRAINER = {"requests": {"cpu": "500m", "memory": "4Gi"}, "limits": {"memory": "16Gi"}}
# Each Ray node of the two-node run: what the e2e node (2 cores, beside the control plane and the
# pools) can schedule twice, and what Kueue's one-run quota holds with the submitter pod, but not
# beside the running first run; the limit is above what a node was measured to use.
RAY_NODE = {"requests": {"cpu": "200m", "memory": "2Gi"}, "limits": {"memory": "12Gi"}}
RAY_NODE_TYPE = "ray.io/node-type"
# The Ray nodes' memory high-water mark as their cgroup counts it (v2, else v1), read while the
# run trains.
MEMORY_FILES = ("memory.peak", "memory/memory.max_usage_in_bytes")
# Three pools at once on a 2-core node that also runs the control plane, KubeRay and Kueue: the
# examples' CPU requests would leave the trainer none.
SMALL_POOL = {"resources": {"cpu": "20m"}, "router": {"cpu": "10m"}}
# An autoscaled pool that starts at zero and returns there 60 s (its idle timeout) after its run:
# long enough for the checks to read its server's counts first.
AT_ZERO = {"minReplicas": 0, "maxReplicas": 1, "scaleDownDelaySeconds": 5}


def _docs(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _create_pools(
    operator: Cluster, namespace: str, path: Path, autoscaling: dict[str, Any] | None = None
) -> list[str]:
    """The pools in PATH, small; Ready, or at zero when AUTOSCALING (with minReplicas 0)."""
    pools = _docs(path)
    for pool in pools:
        spec = pool["spec"]
        spec["resources"]["requests"]["cpu"] = SMALL_POOL["resources"]["cpu"]
        spec["router"]["resources"]["requests"]["cpu"] = SMALL_POOL["router"]["cpu"]
        # The pools' counts must be the runs' own: no canary episodes while a run waits its turn.
        spec["watchdog"] = {**spec.get("watchdog", {}), "canaryIntervalSeconds": 0}
        if autoscaling is not None:
            spec.update(replicas=0, idleTimeoutSeconds=60, autoscaling=autoscaling)
        operator.create(gymkube_path("envpools", namespace), pool)
    names = [pool["metadata"]["name"] for pool in pools]
    for name in names:
        if autoscaling is None:
            operator.wait_pool_ready(namespace, name)
        else:
            _wait_at_zero(operator, namespace, name)
    return names


def _wait_at_zero(operator: Cluster, namespace: str, name: str) -> None:
    def at_zero() -> bool:
        pool = operator.get(gymkube_path("envpools", namespace, name)) or {}
        ready = condition(pool, "Ready") or {}
        return pool["spec"]["replicas"] == 0 and ready.get("reason") == "ScaledToZero"

    wait_until(at_zero, timeout=300, what=f"pool {name} at zero")


def _step_lines(operator: Cluster, namespace: str, pod: str) -> list[dict[str, Any]]:
    """The trainer's step lines (`gymkube-progress` with stepSeconds), from its pod's log."""
    log = operator.kubectl("logs", "-n", namespace, pod, "-c", "trainer", timeout=60)
    lines = [
        json.loads(line.strip().removeprefix(PROGRESS_PREFIX))
        for line in log.splitlines()
        if line.strip().startswith(PROGRESS_PREFIX)
    ]
    return [line for line in lines if "stepSeconds" in line]


def _succeeded(operator: Cluster, namespace: str, name: str) -> dict[str, Any]:
    run = finished(operator, "trainingruns", namespace, name, TRAINING_TIMEOUT_S)
    assert (condition(run, "Succeeded") or {}).get("status") == "True", run["status"]
    status: dict[str, Any] = run["status"]
    return status


def _mixed_run(queue: str) -> dict[str, Any]:
    (run,) = _docs(EXAMPLES / "mixed-pools" / "trainingrun.yaml")
    run["spec"]["resources"] = SMALL_TRAINER
    run["spec"]["queueName"] = queue
    # Two steps of 2 prompts are then one pass over the rows (3 of the lake, 1 of the game).
    run["spec"]["dataset"]["size"] = 4
    return run


def _own_loop_run(queue: str) -> dict[str, Any]:
    (run,) = _docs(EXAMPLES / "custom-agent-loop" / "trainingrun.yaml")
    spec = run["spec"]
    spec["nodes"] = 2
    spec["resources"] = RAY_NODE
    spec["queueName"] = queue
    # The pool then plays only the run's training episodes, so its counts are the run's; one
    # batch of rows leaves verl none to start beyond it.
    spec["preflight"] = {"enabled": False}
    spec["dataset"] = {**spec.get("dataset", {}), "size": 2}
    spec["overrides"] = [
        o for o in spec["overrides"] if not o.startswith("trainer.total_training_steps=")
    ] + ["trainer.total_training_steps=1"]
    return run


def test_two_cpu_runs_share_a_kueue_queue_over_several_pools_and_a_users_own_loop(
    operator: Cluster, settings: E2ESettings, namespace: str
) -> None:
    needs_controllers(settings)
    example = EXAMPLES / "custom-agent-loop"
    with kueue_queue(operator, namespace) as queue:
        pools = _create_pools(operator, namespace, EXAMPLES / "mixed-pools" / "envpools.yaml")
        # The user's loop trains on a pool at zero: the run's demand scales it up.
        (own_pool,) = _create_pools(
            operator, namespace, EXAMPLES / "envpool-frozenlake-easy.yaml", AT_ZERO
        )
        # As its README says: the user's file, as a ConfigMap.
        operator.kubectl(
            "create",
            "configmap",
            "my-loops",
            "-n",
            namespace,
            f"--from-file={example / 'my_loops.py'}",
        )
        mixed, own = _mixed_run(queue), _own_loop_run(queue)
        mixed_name, own_name = mixed["metadata"]["name"], own["metadata"]["name"]

        # 1. The mixed run is admitted and trains; the user's loop, created then, waits in the
        # queue and says so in Kueue's words.
        operator.create(gymkube_path("trainingruns", namespace), mixed)
        wait_until(
            lambda: _phase(operator, namespace, mixed_name) == "Running",
            timeout=TRAINING_TIMEOUT_S,
            what=f"{mixed_name} to be admitted and run",
        )
        operator.create(gymkube_path("trainingruns", namespace), own)
        waiting = wait_until(
            suspended_while_queued(operator, namespace, own_name, "insufficient unused quota"),
            timeout=300,
            what=f"{own_name} to be Queued",
        )
        print(json.dumps({"e2e_queued": waiting}))
        assert waiting["reason"] == "WaitingForAdmission", waiting
        assert f"waits in Kueue LocalQueue {queue}" in waiting["message"], waiting
        assert "insufficient unused quota" in waiting["message"], waiting

        mixed_status = _succeeded(operator, namespace, mixed_name)
        # 2. Then the user's loop is admitted and trains on both Ray nodes.
        ray_nodes = _ray_nodes_while_training(operator, namespace, own_name)
        own_status = _succeeded(operator, namespace, own_name)
        workloads = operator.get(api_path(KUEUE_API, "workloads", namespace)) or {}
    # Kueue admitted the second only once the first was done.
    assert own_status["startTime"] >= mixed_status["completionTime"], (mixed_status, own_status)
    _check_mixed(operator, namespace, pools, mixed_status)
    _check_two_nodes(operator, namespace, own_name, own_status, ray_nodes, workloads, queue)
    _check_own_loop(operator, namespace, own_pool, own_name, ray_nodes)
    # With its run done, the pool goes back to zero after its idle time.
    _wait_at_zero(operator, namespace, own_pool)


def _phase(operator: Cluster, namespace: str, name: str) -> str | None:
    run = operator.get(gymkube_path("trainingruns", namespace, name)) or {}
    phase: str | None = (run.get("status") or {}).get("phase")
    return phase


def _check_mixed(
    operator: Cluster, namespace: str, pools: list[str], status: dict[str, Any]
) -> None:
    # The preflight played each pool, in its own container.
    preflights = status["preflight"]["summary"]["pools"]
    assert set(preflights) == set(pools)
    assert all(summary["ok"] for summary in preflights.values()), preflights
    lines = _step_lines(operator, namespace, status["trainerPod"])
    print(json.dumps({"e2e_mixed_steps": lines}))
    steps = int(status["progress"]["totalSteps"])
    assert [line["step"] for line in lines] == list(range(1, steps + 1))
    assert status["progress"]["pools"] == lines[-1]["pools"]
    for line in lines:
        assert sum(p["episodes"] for p in line["pools"].values()) == line["episodes"], line
    # Each pool's episodes over the run are the ones its env servers played for it: their own
    # count less the preflight's; every row was played, so both pools were. A server restarted
    # on the starved node (its liveness probe unanswered, or the watchdog) counts from zero
    # again: it played no more than the run sent it.
    for pool in pools:
        trained = sum(line["pools"].get(pool, {}).get("episodes", 0) for line in lines)
        played, _ = pool_counts(operator, namespace, pool)
        counts = {
            "pool": pool,
            "trained": trained,
            "played": played,
            "preflight": preflights[pool]["episodes"],
            "restarts": pool_restarts(operator, namespace, pool),
        }
        print(json.dumps({"e2e_mixed_counts": counts}))
        if counts["restarts"]:
            assert played <= trained + counts["preflight"], (counts, lines)
        else:
            assert trained == played - counts["preflight"], (counts, lines)
        assert trained > 0, (pool, lines)
    assert status["envPoolUrls"].keys() == set(pools)


def _ray_pods(operator: Cluster, namespace: str, run: str) -> dict[str, Any]:
    """The run's Ray nodes by node type (head, worker), Running ones only."""
    pods = operator.pods(namespace, f"{RAY_NODE_TYPE},gymkube.io/trainingrun={run}")
    return {
        pod["metadata"]["labels"][RAY_NODE_TYPE]: pod
        for pod in pods
        if (pod.get("status") or {}).get("phase") == "Running"
    }


def _memory_mib(operator: Cluster, namespace: str, pod: dict[str, Any]) -> int | None:
    """The pod's Ray container's cgroup memory high-water mark, MiB."""
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


def _ray_nodes_while_training(operator: Cluster, namespace: str, run: str) -> dict[str, Any]:
    """Until RUN ends: both its Ray nodes (as first seen Running together), and the highest
    memory each used while it trained (printed)."""
    nodes: dict[str, Any] = {}
    peaks: dict[str, int] = {}
    deadline = time.monotonic() + TRAINING_TIMEOUT_S
    while time.monotonic() < deadline:
        found = operator.get(gymkube_path("trainingruns", namespace, run)) or {}
        if any(
            (condition(found, kind) or {}).get("status") == "True"
            for kind in ("Succeeded", "Failed")
        ):
            break
        running = _ray_pods(operator, namespace, run)
        if len(running) == 2:
            nodes = nodes or running
            for kind, pod in running.items():
                used = _memory_mib(operator, namespace, pod)
                if used is not None:
                    peaks[kind] = max(peaks.get(kind, 0), used)
        time.sleep(10)
    print(json.dumps({"e2e_rayjob": {"memory_peak_mib": peaks}}))
    return nodes


def _submitter(operator: Cluster, namespace: str, run: str) -> str:
    """KubeRay's submitter pod of a RayJob run, which follows the driver's log on the Ray head (a
    RayJob run's status names no trainerPod: that is the one-node Job's pod)."""
    submitters = operator.pods(namespace, f"batch.kubernetes.io/job-name={run}-train")
    assert submitters, "KubeRay's submitter pod is gone"
    name: str = submitters[0]["metadata"]["name"]
    return name


def _check_two_nodes(
    operator: Cluster,
    namespace: str,
    run: str,
    status: dict[str, Any],
    nodes: dict[str, Any],
    workloads: dict[str, Any],
    queue: str,
) -> None:
    # The training child was a RayJob, of a head and a worker that ran side by side.
    assert status["training"]["kind"] == "RayJob", status
    assert set(nodes) == {"head", "worker"}, nodes
    # Progress as a one-node run shows it, read from the submitter's log.
    progress = status["progress"]
    assert progress["step"] == progress["totalSteps"] == 1, progress
    assert status["history"]["steps"], status
    # A vLLM server ran on each Ray node: Ray prefixes a line from another node than the driver's
    # (the head's) with that node's IP.
    log = operator.kubectl(
        "logs", "-n", namespace, _submitter(operator, namespace, run), "-c", "trainer"
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


def _check_own_loop(
    operator: Cluster, namespace: str, pool: str, run: str, nodes: dict[str, Any]
) -> None:
    # Both Ray nodes could import the user's class: the ConfigMap mounted on PYTHONPATH.
    for node in nodes.values():
        (ray,) = node["spec"]["containers"]
        assert {"name": "PYTHONPATH", "value": "/opt/gymkube/agent-loop"} in ray["env"], node
    (line,) = _step_lines(operator, namespace, _submitter(operator, namespace, run))
    print(json.dumps({"e2e_own_loop_step": line}))
    # The pool played the step's 2 x 2 episodes through the user's loop, and verl's reward is
    # the pool's own score: its mean over the episodes the loop finished equals the pool's score
    # sum over them. An episode whose loop raised (loopErrors: a session the pool closed under
    # it, say) is not trained, and it never reached the goal, so it scored 0 at the pool too; a
    # group that lost both episodes is replaced by a fresh prompt, which the pool also played.
    episodes, score_sum = pool_counts(operator, namespace, pool)
    errors = line.get("loopErrors", 0)
    # Where the loop's sessions went, when some were lost (a 410 in lastLoopError).
    pool_status = (operator.get(gymkube_path("envpools", namespace, pool)) or {}).get("status", {})
    print(
        json.dumps(
            {
                "e2e_own_loop_pool": {
                    "episodes": episodes,
                    "scores": score_sum,
                    "restarts": pool_status.get("restarts"),
                    "conditions": pool_status.get("conditions"),
                }
            }
        )
    )
    # An episode whose loop could not reach the pool at all (ConnectionRefusedError while the
    # router's endpoint was briefly gone on the starved node) raised without the pool counting it.
    assert episodes >= 4 - errors, (episodes, line)
    assert line["meanReward"] * (episodes - errors) == pytest.approx(score_sum, abs=1e-3), (
        episodes,
        score_sum,
        line,
    )
