"""A CPU TrainingRun trains for real: verl's main_ppo with vLLM on CPU and SmolLM2-135M-Instruct
(the CPU trainer image's own model), gymkube's agent loop playing a FrozenLake pool. One run rides
out every fault gymkube promises to absorb: an env server frozen mid-step (its episodes replayed
on the other server), the trainer pod deleted (retried, resumed from its checkpoint), a `helm
upgrade` that replaces the operator pod (the run goes on, not restarted), and a preemption by a
real Kueue for a run of higher priority (it waits, says why, and resumes from its checkpoint once
readmitted), and still trains exactly its steps.
The run that preempted it has a wrong model path and fails with the trainer's reason."""

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from e2e_cluster import (
    ENVSERVER_PORT,
    FAST_WATCHDOG,
    GROUP,
    VERSION,
    Cluster,
    E2ESettings,
    api_path,
    condition,
    envpool_manifest,
    envserver_selector,
    finished,
    gymkube_path,
    kueue_queue,
    needs_controllers,
    node_directory,
    pool_restarts,
    suspended_while_queued,
    wait_until,
)
from gymkube_agentloop.train import PROGRESS_PREFIX
from gymkube_dev import chart
from gymkube_dev.chart import release_selector
from gymkube_envserver.router.settings import RouterSettings

# The two training runs take several minutes each on a 2-core node. Solo: it times the frozen
# step against its other steps, and upgrades the release.
pytestmark = [pytest.mark.e2e, pytest.mark.solo, pytest.mark.timeout(2700)]

MODEL = "/models/SmolLM2-135M-Instruct"
BATCH, ROLLOUTS = 2, 2
# Succeeded/Failed within this after creation (image already loaded, pool Ready).
TRAINING_TIMEOUT_S = 1500.0


# The test pool's watchdog finds a frozen server within PROBE x THRESHOLD s.
# A frozen server's sessions get their 410 (and are replayed) after the router's dead window;
# the watchdog replaces the server after its probes.
DETECTION_S = max(
    RouterSettings.model_fields["dead_after_seconds"].default,
    FAST_WATCHDOG["probePeriodSeconds"] * FAST_WATCHDOG["failureThreshold"],
)


def _pool(replicas: int = 1) -> dict[str, Any]:
    # 2x2 lakes where a plain move word counts: an untrained 135M model sometimes reaches the goal.
    # More CPU than the suite's token requests, for the CPU share of a server beside the trainer:
    # at 10m, a starved server went past the router's dead window before the freeze, and the
    # freeze's exec came back empty (one CI run).
    return envpool_manifest(
        "lake",
        "frozen_lake",
        replicas,
        sessionsPerReplica=8,
        envConfig={"size": 2, "moves": "word"},
        watchdog=FAST_WATCHDOG,
        resources={"requests": {"cpu": "50m", "memory": "128Mi"}},
        router={"replicas": 1, "resources": {"requests": {"cpu": "20m", "memory": "64Mi"}}},
    )


def _cpu_run(
    name: str,
    steps: int,
    checkpoints: dict[str, Any],
    queue: str,
    priority: str,
    model: str = MODEL,
) -> Any:
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
            "queueName": queue,
            "workloadPriorityClass": priority,
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


@pytest.fixture
def checkpoints(
    operator: Cluster, settings: E2ESettings, namespace: str
) -> Iterator[dict[str, Any]]:
    """A node directory the trainer (uid 10001) can write and that outlives its pods; removed
    afterwards (each run leaves about 3 GB of checkpoints)."""
    with node_directory(
        operator, settings, namespace, lambda path: f"mkdir -p {path} && chmod 0777 {path}"
    ) as volume:
        yield volume


def _progress_lines(
    operator: Cluster, namespace: str, pod: str, *, check: bool = True
) -> list[Any]:
    """The step lines (`gymkube-progress` with stepSeconds) of the trainer in POD (check=False:
    none while its log cannot be read yet)."""
    log = operator.kubectl("logs", "-n", namespace, pod, "-c", "trainer", check=check, timeout=60)
    lines = [
        json.loads(line.removeprefix(PROGRESS_PREFIX))
        for line in log.splitlines()
        if line.startswith(PROGRESS_PREFIX)
    ]
    return [line for line in lines if "stepSeconds" in line]


def _logged_step(operator: Cluster, namespace: str, step: int) -> Callable[[], str | None]:
    """The trainer pod, once its own log has the line of STEP (or a later one): read from the
    log, which the operator's status follows only at its next read."""

    def logged() -> str | None:
        pod: str | None = _run_status(operator, namespace, "lake-grpo").get("trainerPod")
        if pod is None:
            return None
        lines = _progress_lines(operator, namespace, pod, check=False)
        return pod if any(line["step"] >= step for line in lines) else None

    return logged


def _run_status(operator: Cluster, namespace: str, name: str) -> dict[str, Any]:
    run = operator.get(gymkube_path("trainingruns", namespace, name)) or {}
    status: dict[str, Any] = run.get("status") or {}
    return status


def _freeze_at_its_next_session(operator: Cluster, namespace: str) -> int:
    """SIGSTOP one env server as it creates its next session (the next step's episodes starting;
    the router spreads a step's episodes over both servers), so that episode has every turn still
    to play: it is cut off and must be replayed. From inside the pod, as a poll from here and an
    exec would take seconds, and an episode on a 2x2 lake may be over in two turns. Returns the
    replays the frozen server had played before (a starved node can make step 1 replay too)."""
    pod = sorted(operator.names(api_path("v1", "pods", namespace), envserver_selector("lake")))[0]
    return operator.freeze_envserver_at_next_session(namespace, pod, timeout=TRAINING_TIMEOUT_S)


def _replays_counted(operator: Cluster, namespace: str) -> int:
    """Replaying resets the pool's env servers answered, by their own /status."""
    total = 0
    for pod in operator.names(api_path("v1", "pods", namespace), envserver_selector("lake")):
        code, status = operator.pod_http(namespace, pod, ENVSERVER_PORT, "/status", timeout=10)
        assert code == 200, f"/status of {pod}: {code} {status}"
        total += int(status.get("replays", 0))
    return total


def _upgrade_operator(operator: Cluster, settings: E2ESettings) -> None:
    """`helm upgrade` of the release with the operator's pod template changed, as a new operator
    version changes it: the Deployment replaces the operator pod while the run trains."""
    namespace = settings.operator_namespace
    selector = f"{release_selector(settings.release)},app.kubernetes.io/component=operator"
    old = set(operator.names(api_path("v1", "pods", namespace), selector))
    values = chart.merged_values(
        chart.current_values(operator, settings.release, namespace),
        {"podAnnotations": {"gymkube.io/e2e-upgrade": str(time.time_ns())}},
    )
    chart.install(
        operator, settings.release, namespace, values, wait=True, chart_dir=settings.chart
    )

    def replaced() -> bool:
        names = operator.names(api_path("v1", "pods", namespace), selector)
        return any(name not in old and operator.pod_ready(namespace, name) for name in names)

    wait_until(replaced, timeout=180, what="the upgraded operator pod to be Ready")


def _operator_env(operator: Cluster, settings: E2ESettings) -> dict[str, str]:
    """The operator container's environment, as the chart rendered it."""
    namespace = settings.operator_namespace
    selector = release_selector(settings.release)
    (deployment,) = operator.list_objects(api_path("apps/v1", "deployments", namespace), selector)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {item["name"]: str(item.get("value", "")) for item in container.get("env", [])}


STEPS = 6
# An env server is frozen as the episodes of a step after this one start (step 2, or step 3 when
# step 2's had all been placed by the time the freeze was armed).
FREEZE_AFTER_STEP = 1
DELETE_AFTER_CHECKPOINT = 3  # the trainer pod is deleted once this step's checkpoint is written
# A run of higher priority comes to the run's Kueue queue once the operator has seen the trainer
# after the deletion report this step (so the deletion's restart says where it resumed); the
# preemption then stops it in this step or the next, after their checkpoint.
PREEMPT_AFTER_STEP = 4
WRONG_MODEL = "/models/SmolLM2-1.7B-Instruct"
# A step on a 2-core node varies by several seconds from one to the next on its own.
STEP_NOISE_S = 20


def test_a_cpu_run_rides_out_a_frozen_server_a_deleted_trainer_a_helm_upgrade_and_a_preemption(
    operator: Cluster, settings: E2ESettings, namespace: str, checkpoints: dict[str, Any]
) -> None:
    needs_controllers(settings)
    with kueue_queue(operator, namespace) as queue:
        _ride_out_every_fault(operator, settings, namespace, checkpoints, queue)


def _new_trainer_pod(operator: Cluster, namespace: str, old: str) -> Callable[[], str | None]:
    def new() -> str | None:
        pod: str | None = _run_status(operator, namespace, "lake-grpo").get("trainerPod")
        return pod if pod not in (None, old) else None

    return new


def _ride_out_every_fault(
    operator: Cluster,
    settings: E2ESettings,
    namespace: str,
    checkpoints: dict[str, Any],
    queue: str,
) -> None:
    operator.create(gymkube_path("envpools", namespace), _pool(replicas=2))
    operator.wait_pool_ready(namespace, "lake", extra=lambda p: p["status"]["readyReplicas"] == 2)
    operator.create(
        gymkube_path("trainingruns", namespace),
        _cpu_run("lake-grpo", STEPS, checkpoints, queue, "gymkube-e2e-low"),
    )

    # 1. As a later step's episodes start, the server holding some of them freezes (a hung JVM).
    logged = _logged_step(operator, namespace, FREEZE_AFTER_STEP)
    wait_until(logged, timeout=TRAINING_TIMEOUT_S, interval=0.5, what="step 1")
    replayed_on_frozen = _freeze_at_its_next_session(operator, namespace)

    # 2. Once step 3 is checkpointed (its line follows the save), the trainer pod is deleted (as a
    # drain or an eviction would), at once: a pod that goes on to step 4 may reach its memory
    # limit there (docs/train-on-cpu.md).
    checkpointed = _logged_step(operator, namespace, DELETE_AFTER_CHECKPOINT)
    first_pod = wait_until(
        checkpointed, timeout=TRAINING_TIMEOUT_S, interval=0.5, what="checkpoint 3"
    )
    first_steps = _progress_lines(operator, namespace, first_pod)
    operator.delete(api_path("v1", "pods", namespace, first_pod))

    # 3. Once the Job has started its replacement, the release is upgraded: a new operator pod
    # takes over while the run trains (the restarts counted below are the faults' only).
    second_pod = wait_until(
        _new_trainer_pod(operator, namespace, first_pod), timeout=300, what="a new trainer pod"
    )
    _upgrade_operator(operator, settings)

    # 4. Once the operator has seen step 4, a run of higher priority comes to the queue, whose
    # quota holds one run: Kueue preempts this one, which says so and waits.
    def step_seen() -> bool:
        status = _run_status(operator, namespace, "lake-grpo")
        seen = (status.get("progress") or {}).get("step", 0) >= PREEMPT_AFTER_STEP
        recent = (status.get("restarts") or {}).get("recent") or [{}]
        return seen and recent[-1].get("resumedFromStep") is not None

    wait_until(step_seen, timeout=TRAINING_TIMEOUT_S, interval=0.5, what="step 4 in status")
    operator.create(
        gymkube_path("trainingruns", namespace),
        _cpu_run("lost", 1, {"emptyDir": {}}, queue, "gymkube-e2e-high", model=WRONG_MODEL),
    )
    second_steps: list[Any] = []

    def preempted() -> Any:
        # The stopped trainer's lines, read while its log is there.
        second_steps[:] = _progress_lines(operator, namespace, second_pod, check=False) or (
            second_steps
        )
        return suspended_while_queued(operator, namespace, "lake-grpo", "preempted by Kueue")()

    waiting = wait_until(preempted, timeout=300, interval=0.5, what="lake-grpo to be preempted")
    print(json.dumps({"e2e_preempted": waiting}))
    assert waiting["reason"] == "Preempted", waiting
    assert (
        "was preempted by Kueue (Preempted: Preempted to accommodate a workload"
        in (waiting["message"])
    ), waiting
    assert f"it waits in Kueue LocalQueue {queue}" in waiting["message"], waiting

    # 5. The run that preempted it fails at once with the trainer's reason (a wrong model path);
    # Kueue then admits the preempted run again, which resumes from its last checkpoint.
    lost = finished(operator, "trainingruns", namespace, "lost", TRAINING_TIMEOUT_S)
    failed = condition(lost, "Failed") or {}
    assert failed.get("status") == "True", lost["status"]
    assert f"model path {WRONG_MODEL} does not exist" in failed["message"]
    # The directory's real content is named, so the typo is plain to see.
    assert "SmolLM2-135M-Instruct" in failed["message"]
    third_pod = wait_until(
        _new_trainer_pod(operator, namespace, second_pod), timeout=600, what="a readmitted pod"
    )

    run = finished(operator, "trainingruns", namespace, "lake-grpo", TRAINING_TIMEOUT_S)
    assert (condition(run, "Succeeded") or {}).get("status") == "True", run["status"]
    status = run["status"]
    assert (status["progress"]["step"], status["progress"]["totalSteps"]) == (STEPS, STEPS)

    # The deletion and the preemption were restarts, not failures; each next pod went on from
    # the last checkpoint.
    restarts = status["restarts"]
    assert restarts["count"] == 2, restarts
    deleted, preempted_at = restarts["recent"]
    assert (deleted["pod"], deleted["reason"]) == (first_pod, "Deleted"), restarts
    assert deleted["resumedFromStep"] == DELETE_AFTER_CHECKPOINT, restarts
    assert (preempted_at["pod"], preempted_at["reason"]) == (second_pod, "Suspended"), restarts
    resumed = preempted_at["resumedFromStep"]
    assert PREEMPT_AFTER_STEP <= resumed < STEPS, restarts

    # Exactly STEPS steps, each once: the first pod's up to its checkpoint, each next one's after.
    third_steps = _progress_lines(operator, namespace, third_pod)
    assert [line["step"] for line in first_steps] == list(range(1, DELETE_AFTER_CHECKPOINT + 1))
    assert [line["step"] for line in second_steps][:1] == [DELETE_AFTER_CHECKPOINT + 1]
    assert [line["step"] for line in third_steps] == list(range(resumed + 1, STEPS + 1))
    assert {line["resumedFromStep"] for line in second_steps} == {DELETE_AFTER_CHECKPOINT}
    assert {line["resumedFromStep"] for line in third_steps} == {resumed}
    history = status["history"]["steps"]
    assert [step["step"] for step in history] == list(range(1, STEPS + 1)), history
    lines = first_steps + second_steps + third_steps

    # Every episode trained: those on the frozen server were replayed on the other, none left out.
    # Each step as the operator recorded it (the stopped pod's last line may have gone with it).
    steps = {step["step"]: step for step in history}
    print(json.dumps({"e2e_fault_steps": lines}))
    assert all(line["episodes"] == BATCH * ROLLOUTS for line in steps.values()), steps
    # The first step with replays after the freeze was armed is the frozen one. Any step may
    # replay too where a starved node made a server miss the client's deadline (a cold CI run
    # replayed one episode of step 1, 120 s long, and trained it).
    replayed = [step for step, line in steps.items() if line["episodesReplayed"] > 0]
    after_freeze = [step for step in replayed if step > FREEZE_AFTER_STEP]
    # The episode in play on the frozen server is cut and replayed on the other. Two CI runs on a
    # starved node replayed none after the freeze, the cause not pinned down (the episode over, or
    # its create not yet answered, when the stop took hold): then nothing was cut, and the freeze
    # still cost the run nothing: every step trained all its episodes (above), none left out.
    frozen_step = min(after_freeze) if after_freeze else None
    print(json.dumps({"e2e_frozen_step_replayed": frozen_step}))
    assert frozen_step is None or frozen_step <= DELETE_AFTER_CHECKPOINT, steps
    assert sum(line["episodesExcluded"] for line in steps.values()) == 0, steps
    assert sum(line["replayCanaryFailures"] for line in lines) == 0, lines
    # The env servers counted the replays too: the live ones, and the frozen one those it played
    # before its freeze (its replacement starts from 0). They may count more than the trained
    # steps show: a trainer pod deleted or preempted mid-step took that step's replays with it
    # (the step was played again by the next pod; a CI run counted 3 against 2). A server the
    # watchdog replaced for another reason (a starved node) took its count with it.
    replays = sum(line["episodesReplayed"] for line in steps.values())
    counted = _replays_counted(operator, namespace) + replayed_on_frozen
    server_restarts = pool_restarts(operator, namespace, "lake")
    print(json.dumps({"e2e_replays": replays, "counted": counted, "restarts": server_restarts}))
    if server_restarts == 1:
        assert counted >= replays, steps
    elif replays:
        assert counted > 0, steps
    # The trainer ran the operator's default CPU trainer image: after the registry test's
    # upgrade (earlier in the suite), the one pulled from the registry.
    pod = operator.get(api_path("v1", "pods", namespace, third_pod)) or {}
    (image,) = {c["image"] for c in pod["spec"]["containers"] if c["name"] == "trainer"}
    print(json.dumps({"e2e_trainer_image": image}))
    assert image == _operator_env(operator, settings)["GYMKUBE_CPU_TRAINER_IMAGE"]

    # The freeze cost its step no more than the time to find the server dead: against the
    # slowest other step after the first (the first also warms up).
    if frozen_step is not None:
        normal = max(
            line["stepSeconds"] for step, line in steps.items() if step not in (1, frozen_step)
        )
        frozen_seconds = steps[frozen_step]["stepSeconds"]
        timing = {"e2e_frozen_step": frozen_step, "seconds": frozen_seconds, "normal": normal}
        print(json.dumps(timing))
        assert frozen_seconds <= normal + DETECTION_S + STEP_NOISE_S, steps
