"""CPU TrainingRuns beyond one pool and gymkube's loop, as a user writes them, queued in a real
Kueue: the mixed-pools example over a FrozenLake and a TextArena pool, whose per-pool figures are
each pool's own episode counts, and the custom-agent-loop example, a user's loop from a ConfigMap
whose rewards are the pool's own scores, on a pool that starts at zero, grows for the run's demand
and returns to zero after it. Both go to one LocalQueue whose quota holds one run: the
second waits, says why in Kueue's words, and trains once the first is done. Each trains a step or
two of SmolLM2-135M on the CPU trainer image."""

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_cluster import (
    Cluster,
    E2ESettings,
    api_path,
    condition,
    finished,
    gymkube_path,
    kueue_queue,
    needs_controllers,
    pool_counts,
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
        json.loads(line.removeprefix(PROGRESS_PREFIX))
        for line in log.splitlines()
        if line.startswith(PROGRESS_PREFIX)
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
    spec["resources"] = SMALL_TRAINER
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
        own_status = _succeeded(operator, namespace, own_name)
    # Kueue admitted the second only once the first was done.
    assert own_status["startTime"] >= mixed_status["completionTime"], (mixed_status, own_status)
    _check_mixed(operator, namespace, pools, mixed_status)
    _check_own_loop(operator, namespace, own_pool, own_status)
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
    # count less the preflight's; every row was played, so both pools were.
    for pool in pools:
        trained = sum(line["pools"].get(pool, {}).get("episodes", 0) for line in lines)
        played, _ = pool_counts(operator, namespace, pool)
        assert trained == played - preflights[pool]["episodes"], (pool, lines)
        assert trained > 0, (pool, lines)
    assert status["envPoolUrls"].keys() == set(pools)


def _check_own_loop(operator: Cluster, namespace: str, pool: str, status: dict[str, Any]) -> None:
    # The trainer pod ran the user's class from the mounted ConfigMap.
    pod = operator.get(api_path("v1", "pods", namespace, status["trainerPod"])) or {}
    (trainer,) = [c for c in pod["spec"]["containers"] if c["name"] == "trainer"]
    assert {"name": "PYTHONPATH", "value": "/opt/gymkube/agent-loop"} in trainer["env"]
    (line,) = _step_lines(operator, namespace, status["trainerPod"])
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
    assert episodes >= 4, (episodes, line)
    assert line["meanReward"] * (episodes - errors) == pytest.approx(score_sum, abs=1e-3), (
        episodes,
        score_sum,
        line,
    )
