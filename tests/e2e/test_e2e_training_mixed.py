"""CPU TrainingRuns beyond one pool and gymkube's loop, as a user writes them: the mixed-pools
example over a FrozenLake and a TextArena pool, whose per-pool figures are each pool's own
episode counts, and the custom-agent-loop example, a user's loop from a ConfigMap whose rewards
are the pool's own scores. Each trains a step or two of SmolLM2-135M on the CPU trainer image."""

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_cluster import (
    Cluster,
    api_path,
    condition,
    finished,
    gymkube_path,
    pool_counts,
)
from gymkube_agentloop.train import PROGRESS_PREFIX

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
# Succeeded within this after creation (images loaded, pools Ready).
TRAINING_TIMEOUT_S = 1200.0
# What a CI node can hold beside the pools: the examples ask for a larger one.
SMALL_TRAINER = {"requests": {"cpu": "500m", "memory": "4Gi"}, "limits": {"memory": "16Gi"}}


def _docs(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _create_pools(operator: Cluster, namespace: str, path: Path) -> list[str]:
    pools = _docs(path)
    for pool in pools:
        operator.create(gymkube_path("envpools", namespace), pool)
    names = [pool["metadata"]["name"] for pool in pools]
    for name in names:
        operator.wait_pool_ready(namespace, name)
    return names


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


def test_a_cpu_run_over_two_pools_reports_each_pools_own_episodes(
    operator: Cluster, namespace: str
) -> None:
    pools = _create_pools(operator, namespace, EXAMPLES / "mixed-pools" / "envpools.yaml")
    (run,) = _docs(EXAMPLES / "mixed-pools" / "trainingrun.yaml")
    run["spec"]["resources"] = SMALL_TRAINER
    # Two steps of 2 prompts are then one pass over the rows (3 of the lake, 1 of the game).
    run["spec"]["dataset"]["size"] = 4
    operator.create(gymkube_path("trainingruns", namespace), run)
    status = _succeeded(operator, namespace, run["metadata"]["name"])

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


def test_a_cpu_run_of_a_users_own_loop_from_a_config_map_rewards_the_pools_scores(
    operator: Cluster, namespace: str
) -> None:
    example = EXAMPLES / "custom-agent-loop"
    (pool,) = _create_pools(operator, namespace, EXAMPLES / "envpool-frozenlake-easy.yaml")
    # As its README says: the user's file, as a ConfigMap.
    operator.kubectl(
        "create",
        "configmap",
        "my-loops",
        "-n",
        namespace,
        f"--from-file={example / 'my_loops.py'}",
    )
    (run,) = _docs(example / "trainingrun.yaml")
    spec = run["spec"]
    spec["resources"] = SMALL_TRAINER
    # The pool then plays only the run's training episodes, so its counts are the run's.
    spec["preflight"] = {"enabled": False}
    spec["overrides"] = [
        o for o in spec["overrides"] if not o.startswith("trainer.total_training_steps=")
    ] + ["trainer.total_training_steps=1"]
    operator.create(gymkube_path("trainingruns", namespace), run)
    status = _succeeded(operator, namespace, run["metadata"]["name"])

    # The trainer pod ran the user's class from the mounted ConfigMap.
    pod = operator.get(api_path("v1", "pods", namespace, status["trainerPod"])) or {}
    (trainer,) = [c for c in pod["spec"]["containers"] if c["name"] == "trainer"]
    assert {"name": "PYTHONPATH", "value": "/opt/gymkube/agent-loop"} in trainer["env"]
    (line,) = _step_lines(operator, namespace, status["trainerPod"])
    print(json.dumps({"e2e_own_loop_step": line}))
    # verl's mean reward of the step's 2 x 2 episodes is the pool's own mean score (FrozenLake
    # scores 0..1), and the pool played exactly those episodes.
    episodes, score_sum = pool_counts(operator, namespace, pool)
    assert episodes == 4, (episodes, line)
    assert line["meanReward"] == pytest.approx(score_sum / episodes, abs=1e-4), line
