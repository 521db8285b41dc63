"""A CPU TrainingRun trains for real: verl's main_ppo with vLLM on CPU and SmolLM2-135M-Instruct
(the CPU trainer image's own model), gymkube's agent loop playing a FrozenLake pool. It succeeds
with rewards that are the env servers' own scores, resumes from its checkpoint when recreated, and
a wrong model path fails with the trainer's reason in the run's status."""

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
    envserver_selector,
    gymkube_path,
    wait_until,
)
from gymkube_agentloop.train import PROGRESS_PREFIX

# The two training runs take several minutes each on a 2-core node.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(2700)]

MODEL = "/models/SmolLM2-135M-Instruct"
BATCH, ROLLOUTS = 2, 2
# Succeeded/Failed within this after creation (image already loaded, pool Ready).
TRAINING_TIMEOUT_S = 1500.0


def _pool() -> dict[str, Any]:
    # 2x2 lakes where a plain move word counts: an untrained 135M model sometimes reaches the goal.
    return envpool_manifest(
        "lake", "frozen_lake", 1, sessionsPerReplica=8, envConfig={"size": 2, "moves": "word"}
    )


def _cpu_run(name: str, steps: int, checkpoints: dict[str, Any], model: str = MODEL) -> Any:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainingRun",
        "metadata": {"name": name},
        "spec": {
            "envPoolRef": {"name": "lake"},
            "device": "cpu",
            "model": {"path": model},
            "resources": {
                "requests": {"cpu": "500m", "memory": "4Gi"},
                "limits": {"memory": "16Gi"},
            },
            "shmSize": "2Gi",
            "agentLoop": {
                "maxTurns": 3,
                "maxObservationTokens": 256,
                "maxPromptTokens": 512,
                "maxResponseTokens": 512,
            },
            "dataset": {"size": 8, "valSize": 2},
            # The pool then serves only the training episodes, so its counts are the run's.
            "preflight": {"enabled": False},
            "checkpoints": checkpoints,
            "overrides": [
                f"data.train_batch_size={BATCH}",
                f"actor_rollout_ref.rollout.n={ROLLOUTS}",
                f"actor_rollout_ref.actor.ppo_mini_batch_size={BATCH}",
                "actor_rollout_ref.rollout.response_length=64",
                f"trainer.total_training_steps={steps}",
                "trainer.save_freq=1",
                "trainer.test_freq=-1",
                "trainer.val_before_train=false",
            ],
        },
    }


# On the node, under /tmp: the local cluster's node is this machine, so the fixture removes it.
NODE_DIR = "/tmp/gymkube-e2e"


def _run_on_node(
    operator: Cluster, settings: E2ESettings, namespace: str, name: str, command: str
) -> None:
    """Run a shell command as root in a pod with the node's NODE_DIR at /e2e, to its end."""
    volume = {"hostPath": {"path": NODE_DIR, "type": "DirectoryOrCreate"}}
    operator.create(
        api_path("v1", "pods", namespace),
        {
            "metadata": {"name": name},
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": name,
                        "image": settings.preflight_image,
                        "imagePullPolicy": settings.image_pull_policy,
                        "command": ["sh", "-c", command],
                        "securityContext": {"runAsUser": 0},
                        "volumeMounts": [{"name": "e2e", "mountPath": "/e2e"}],
                    }
                ],
                "volumes": [{"name": "e2e", **volume}],
            },
        },
    )

    def done() -> bool:
        pod = operator.get(api_path("v1", "pods", namespace, name)) or {}
        return (pod.get("status") or {}).get("phase") == "Succeeded"

    wait_until(done, timeout=120, what=f"pod {name} to finish `{command}`")


@pytest.fixture
def checkpoints(
    operator: Cluster, settings: E2ESettings, namespace: str
) -> Iterator[dict[str, Any]]:
    """A node directory the trainer (uid 10001) can write and that outlives its pods; removed
    afterwards (each run leaves about 3 GB of checkpoints)."""
    directory = f"/e2e/{namespace}"
    _run_on_node(
        operator,
        settings,
        namespace,
        "checkpoints-dir",
        f"mkdir -p {directory} && chmod 0777 {directory}",
    )
    yield {"hostPath": {"path": f"{NODE_DIR}/{namespace}", "type": "Directory"}}
    _run_on_node(operator, settings, namespace, "checkpoints-gone", f"rm -rf {directory}")


def _finished(operator: Cluster, namespace: str, name: str) -> dict[str, Any]:
    path = gymkube_path("trainingruns", namespace, name)

    def ended() -> bool:
        run = operator.get(path) or {}
        return any(
            c.get("type") in ("Succeeded", "Failed") and c.get("status") == "True"
            for c in (run.get("status") or {}).get("conditions") or []
        )

    wait_until(ended, timeout=TRAINING_TIMEOUT_S, what=f"trainingrun/{name} to finish")
    run = operator.get(path)
    assert run is not None
    return run


def _progress_lines(operator: Cluster, namespace: str, run: dict[str, Any]) -> list[Any]:
    job = run["status"]["training"]["name"]
    (pod,) = operator.names(api_path("v1", "pods", namespace), f"job-name={job}")
    log = operator.kubectl("logs", "-n", namespace, pod, "-c", "trainer", timeout=60)
    return [
        json.loads(line.removeprefix(PROGRESS_PREFIX))
        for line in log.splitlines()
        if line.startswith(PROGRESS_PREFIX)
    ]


def _pool_episodes(operator: Cluster, namespace: str) -> tuple[float, float]:
    """(episodes, sum of their final scores) as the pool's env servers counted them."""
    episodes = scores = 0.0
    for pod in operator.names(api_path("v1", "pods", namespace), envserver_selector("lake")):
        metrics = operator.exec_python(
            namespace,
            pod,
            "import urllib.request; print(urllib.request.urlopen("
            "'http://127.0.0.1:8000/metrics', timeout=5).read().decode())",
        )
        for line in metrics.splitlines():
            name, _, value = line.partition(" ")
            if name == "gymkube_envserver_episodes_total":
                episodes += float(value)
            elif name == "gymkube_envserver_episode_score_total":
                scores += float(value)
    return episodes, scores


def test_a_cpu_run_trains_with_the_pools_scores_and_resumes_from_its_checkpoint(
    operator: Cluster, namespace: str, checkpoints: dict[str, Any]
) -> None:
    operator.create(gymkube_path("envpools", namespace), _pool())
    operator.wait_pool_ready(namespace, "lake")

    operator.create(gymkube_path("trainingruns", namespace), _cpu_run("lake-grpo", 1, checkpoints))
    run = _finished(operator, namespace, "lake-grpo")
    succeeded = condition(run, "Succeeded") or {}
    assert succeeded.get("status") == "True", run["status"]
    progress = run["status"]["progress"]
    assert (progress["step"], progress["totalSteps"]) == (1, 1)
    assert progress["checkpoint"] == "/checkpoints/lake-grpo/global_step_1"

    # verl's mean reward per step is the mean of the env's own final scores (FrozenLake: 0 or 1).
    steps = _progress_lines(operator, namespace, run)
    assert [line["step"] for line in steps] == [1]
    episodes, scores = _pool_episodes(operator, namespace)
    assert episodes == BATCH * ROLLOUTS
    rewarded = sum(line["meanReward"] * BATCH * ROLLOUTS for line in steps)
    assert rewarded == pytest.approx(scores, abs=1e-6)

    # Recreated under the same name, the run goes on from its last checkpoint, not from step 0.
    operator.delete(gymkube_path("trainingruns", namespace, "lake-grpo"))
    wait_until(
        lambda: operator.get(gymkube_path("trainingruns", namespace, "lake-grpo")) is None,
        timeout=120,
        what="the first run to be deleted",
    )
    operator.create(gymkube_path("trainingruns", namespace), _cpu_run("lake-grpo", 2, checkpoints))
    resumed = _finished(operator, namespace, "lake-grpo")
    assert (condition(resumed, "Succeeded") or {}).get("status") == "True", resumed["status"]
    assert [line["step"] for line in _progress_lines(operator, namespace, resumed)] == [2]
    assert resumed["status"]["progress"]["checkpoint"] == "/checkpoints/lake-grpo/global_step_2"


def test_a_cpu_run_with_a_wrong_model_path_fails_with_the_reason(
    operator: Cluster, settings: E2ESettings, namespace: str
) -> None:
    operator.create(gymkube_path("envpools", namespace), _pool())
    operator.wait_pool_ready(namespace, "lake")
    operator.create(
        gymkube_path("trainingruns", namespace),
        _cpu_run("lost", 1, {"emptyDir": {}}, model="/models/SmolLM2-1.7B-Instruct"),
    )
    run = _finished(operator, namespace, "lost")
    failed = condition(run, "Failed") or {}
    assert failed.get("status") == "True", run["status"]
    assert "model path /models/SmolLM2-1.7B-Instruct does not exist" in failed["message"]
    # The directory's real content is named, so the typo is plain to see.
    assert "SmolLM2-135M-Instruct" in failed["message"]
