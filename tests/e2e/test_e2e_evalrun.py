"""EvalRuns on a real cluster: the base model (SmolLM2-135M-Instruct, the CPU trainer image's
own) scored through a small FrozenLake pool by gymkube-eval, its score the very one the pool's
env servers count, and an eval of a TrainingRun checkpoint step that was never saved failing with
gymkube-eval's readable reason."""

import json
from collections.abc import Iterator
from typing import Any

import pytest
from e2e_cluster import (
    GROUP,
    VERSION,
    Cluster,
    E2ESettings,
    api_path,
    condition,
    envpool_manifest,
    finished,
    gymkube_path,
    node_directory,
    pool_counts,
)
from gymkube_operator.evalrun import render
from gymkube_operator.evalrun.reasons import Reason

# One eval on CPU takes minutes on a 2-core node (vLLM starting, 8 episodes of a 135M model).
# Solo: its vLLM's GBs beside the two-node training run would crowd a 24 GiB node.
pytestmark = [pytest.mark.e2e, pytest.mark.solo, pytest.mark.timeout(1800)]

MODEL = "/models/SmolLM2-135M-Instruct"
TASKS = 8
EVAL_TIMEOUT_S = 1200.0
SAVED_STEPS = (1, 2)


def _pool() -> dict[str, Any]:
    # 2x2 lakes where a plain move word counts: an untrained 135M model sometimes reaches the goal.
    pool: dict[str, Any] = envpool_manifest(
        "lake", "frozen_lake", 1, sessionsPerReplica=8, envConfig={"size": 2, "moves": "word"}
    )
    return pool


def _eval(name: str, model: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "EvalRun",
        "metadata": {"name": name},
        "spec": {
            "envPoolRef": {"name": "lake"},
            "device": "cpu",
            "model": model,
            "resources": {
                "requests": {"cpu": "500m", "memory": "2Gi"},
                "limits": {"memory": "8Gi"},
            },
            "shmSize": "1Gi",
            "agentLoop": {
                "maxTurns": 3,
                "maxObservationTokens": 256,
                "maxPromptTokens": 512,
                "maxResponseTokens": 512,
            },
            "dataset": {"size": TASKS},
            "activeDeadlineSeconds": int(EVAL_TIMEOUT_S),
        },
    }


def test_the_base_model_is_scored_as_the_pool_counts_its_episodes(
    operator: Cluster, namespace: str
) -> None:
    operator.create(gymkube_path("envpools", namespace), _pool())
    operator.wait_pool_ready(namespace, "lake")
    assert pool_counts(operator, namespace, "lake")[0] == 0
    operator.create(gymkube_path("evalruns", namespace), _eval("base", {"path": MODEL}))

    done = finished(operator, "evalruns", namespace, "base", EVAL_TIMEOUT_S)
    assert (condition(done, "Succeeded") or {}).get("status") == "True", done["status"]
    status = done["status"]
    result = status["result"]
    assert result["episodes"] == TASKS
    assert "checkpointStep" not in result
    assert result["envErrors"] == 0
    assert status["progress"] == {
        "episodes": TASKS,
        "total": TASKS,
        "successes": result["successes"],
        "meanScore": result["meanScore"],
    }
    lo, hi = result["meanScoreInterval"]
    assert lo <= result["meanScore"] <= hi

    # The score is the pool's own: every episode the eval played ended on its env servers, and
    # FrozenLake's score scale is 0..1, so the normalised mean is the servers' mean score.
    episodes, score_sum = pool_counts(operator, namespace, "lake")
    assert episodes == result["episodes"]
    assert score_sum / episodes == pytest.approx(result["meanScore"])

    config_map = operator.get(
        api_path("v1", "configmaps", namespace, render.results_config_map_name("base"))
    )
    assert config_map is not None, "no per-task results"
    assert status["resultsConfigMap"] == config_map["metadata"]["name"]
    tasks = json.loads(config_map["data"][render.TASKS_FILE])
    assert sum(task["episodes"] for task in tasks) == TASKS
    assert sum(task["successes"] for task in tasks) == result["successes"]

    listed = operator.kubectl("get", "evr", "-n", namespace, "base")
    assert MODEL in listed
    assert "Succeeded" in listed


@pytest.fixture
def saved_steps(
    operator: Cluster, settings: E2ESettings, namespace: str
) -> Iterator[dict[str, Any]]:
    """A node directory holding lake-grpo's checkpoint directories for SAVED_STEPS, laid out as
    verl saves them (without weights): a TrainingRun's checkpoints volume; removed afterwards."""

    def make(path: str) -> str:
        steps = " ".join(
            f"{path}/lake-grpo/global_step_{step}/actor/huggingface" for step in SAVED_STEPS
        )
        return f"mkdir -p {steps} && chmod -R 0755 {path}"

    with node_directory(operator, settings, namespace, make) as volume:
        yield volume


def test_a_checkpoint_step_never_saved_fails_with_the_reason(
    operator: Cluster, namespace: str, saved_steps: dict[str, Any]
) -> None:
    operator.create(gymkube_path("envpools", namespace), _pool())
    # Suspended: the run never trains; its checkpoints volume is what the eval reads.
    operator.create(
        gymkube_path("trainingruns", namespace),
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "TrainingRun",
            "metadata": {"name": "lake-grpo"},
            "spec": {
                "envPoolRef": {"name": "lake"},
                "device": "cpu",
                "model": {"path": MODEL},
                "checkpoints": saved_steps,
                "suspend": True,
            },
        },
    )
    evaluation = _eval("step-7", {"trainingRun": {"name": "lake-grpo", "step": 7}})
    evaluation["spec"]["backoffLimit"] = 2
    operator.create(gymkube_path("evalruns", namespace), evaluation)

    done = finished(operator, "evalruns", namespace, "step-7", EVAL_TIMEOUT_S)
    failed = condition(done, "Failed") or {}
    assert failed.get("status") == "True", done["status"]
    assert failed["reason"] == Reason.INVALID_MODEL, failed
    assert "checkpoint step 7 not found under /checkpoints/lake-grpo" in failed["message"]
    assert ", ".join(map(str, SAVED_STEPS)) in failed["message"]  # the steps that were saved
    assert done["status"]["model"] == "lake-grpo@7"
    job = operator.get(api_path("batch/v1", "jobs", namespace, render.job_name("step-7")))
    assert job is not None
    # Failed at once, backoffLimit notwithstanding: a missing checkpoint is not retried.
    assert (job.get("status") or {}).get("failed") == 1
