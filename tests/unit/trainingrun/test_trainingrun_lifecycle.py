"""The TrainingRun life, one pure reconcile at a time: what is created, and what status says."""

import datetime
import json
from pathlib import Path
from typing import Any

import pytest
from gymkube_operator.conditions import MAX_LINE
from gymkube_operator.objects import Object
from gymkube_operator.trainingrun import lifecycle, readings, restarts
from gymkube_operator.trainingrun.command import Run
from gymkube_operator.trainingrun.lifecycle import Observed, Plan
from gymkube_operator.trainingrun.models import (
    RECENT_RESTARTS,
    Phase,
    TrainingProgress,
    TrainingRunSpec,
    TrainingRunStatus,
)
from gymkube_operator.trainingrun.overrides import OverrideProblem
from gymkube_operator.trainingrun.reasons import Reason
from pydantic import ValidationError

pytestmark = pytest.mark.unit

NOW = datetime.datetime(2026, 5, 1, 12, 0, 0, tzinfo=datetime.UTC)
RUN = Run(
    name="grpo",
    namespace="rl",
    uid="uid-1",
    generation=3,
    trainer_image="reg/trainer:1",
    cpu_trainer_image="reg/trainer-cpu:1",
    preflight_image="reg/preflight:1",
    image_pull_policy="IfNotPresent",
)
URL = "http://sciworld.rl.svc:8000"
SUMMARY = {"ok": True, "episodes": 8, "mean_score": 0.4}


def spec(**fields: Any) -> TrainingRunSpec:
    return TrainingRunSpec.model_validate(
        {"envPoolRef": {"name": "sciworld"}, "model": {"path": "/models/q"}, **fields}
    )


def pool(ready: bool = True, reason: str = "Ready") -> Object:
    return {
        "metadata": {"name": "sciworld"},
        "spec": {"env": "sciworld"},
        "status": {
            "url": URL,
            "conditions": [
                {"type": "Ready", "status": "True" if ready else "False", "reason": reason}
            ],
        },
    }


def job(name: str, *conditions: tuple[str, str], **status: Any) -> Object:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {"suspend": status.pop("suspend", False)},
        "status": {
            "conditions": [
                {"type": t, "status": "True", "reason": r, "message": f"{t} because {r}"}
                for t, r in conditions
            ],
            **status,
        },
    }


def rayjob(deployment: str, job_status: str = "", **status: Any) -> Object:
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": "grpo-train"},
        "spec": {"suspend": False},
        "status": {"jobDeploymentStatus": deployment, "jobStatus": job_status, **status},
    }


def step(
    observed: Observed,
    previous: TrainingRunStatus | None = None,
    now: datetime.datetime = NOW,
    **fields: Any,
) -> Plan:
    return lifecycle.plan(RUN, spec(**fields), previous or TrainingRunStatus(), observed, now)


def condition(plan: Plan, type_: str) -> tuple[str, str]:
    found = next(c for c in plan.status.conditions if c.type == type_)
    return found.status.value, found.reason


def created(plan: Plan) -> list[tuple[str, str]]:
    return [(o["kind"], o["metadata"]["name"]) for o in plan.create]


def test_missing_pool_waits_and_creates_nothing() -> None:
    plan = step(Observed(pool=None))
    assert plan.create == []
    assert plan.status.phase == Phase.WAITING_FOR_ENV_POOL
    assert condition(plan, "EnvPoolReady") == ("False", "EnvPoolNotFound")
    assert condition(plan, "Running") == ("False", "WaitingForEnvPool")
    assert plan.status.observed_generation == 3
    assert [e.reason for e in plan.events] == ["EnvPoolNotFound"]


def test_pool_not_ready_says_why_and_creates_nothing() -> None:
    plan = step(Observed(pool=pool(ready=False, reason="ServersNotReady")))
    assert plan.create == []
    assert condition(plan, "EnvPoolReady") == ("False", "EnvPoolNotReady")
    message = next(c.message for c in plan.status.conditions if c.type == "EnvPoolReady")
    assert "ServersNotReady" in message


def test_ready_pool_starts_the_preflight_only() -> None:
    plan = step(Observed(pool=pool()))
    # The run's ConfigMap comes first: a preflight with the run's own templates mounts it.
    assert created(plan) == [("ConfigMap", "grpo-agent-loop"), ("Job", "grpo-preflight")]
    assert plan.status.phase == Phase.PREFLIGHT
    assert plan.status.env_pool_url == URL
    assert condition(plan, "EnvPoolReady") == ("True", "EnvPoolReady")
    assert condition(plan, "PreflightPassed") == ("Unknown", "PreflightRunning")
    assert plan.status.preflight is not None
    assert plan.status.preflight.job_name == "grpo-preflight"


def test_running_preflight_creates_nothing_more() -> None:
    first = step(Observed(pool=pool()))
    plan = step(Observed(pool=pool(), preflight_job=job("grpo-preflight")), first.status)
    assert plan.create == []
    assert plan.status.phase == Phase.PREFLIGHT
    assert plan.events == []


def test_passed_preflight_creates_config_map_and_training_job() -> None:
    first = step(Observed(pool=pool()))
    done = job("grpo-preflight", ("Complete", "Completed"))
    plan = step(
        Observed(
            pool=pool(), preflight_job=done, preflight_messages={"preflight": json.dumps(SUMMARY)}
        ),
        first.status,
    )
    assert created(plan) == [("ConfigMap", "grpo-agent-loop"), ("Job", "grpo-train")]
    assert condition(plan, "PreflightPassed") == ("True", "PreflightSucceeded")
    assert plan.status.preflight is not None
    assert plan.status.preflight.summary == SUMMARY
    assert plan.status.preflight.passed is True
    message = next(c.message for c in plan.status.conditions if c.type == "PreflightPassed")
    assert message == "8 episodes; mean score 0.40; env errors: none"
    assert plan.status.phase == Phase.STARTING
    assert plan.status.training is not None
    assert (plan.status.training.kind, plan.status.training.name) == ("Job", "grpo-train")
    assert {e.reason for e in plan.events} == {"PreflightSucceeded", "TrainingCreated"}


def test_failed_preflight_fails_the_run_with_its_summary() -> None:
    first = step(Observed(pool=pool()))
    failed = job("grpo-preflight", ("Failed", "BackoffLimitExceeded"))
    summary = {"ok": False, "env_errors": {"http_500": 3}}
    plan = step(
        Observed(
            pool=pool(), preflight_job=failed, preflight_messages={"preflight": json.dumps(summary)}
        ),
        first.status,
    )
    assert plan.create == []
    assert plan.status.phase == Phase.FAILED
    assert condition(plan, "Failed") == ("True", "PreflightFailed")
    assert condition(plan, "PreflightPassed") == ("False", "PreflightFailed")
    assert next(c.message for c in plan.status.conditions if c.type == "Failed") == (
        "preflight Job grpo-preflight failed: ? episodes; env errors: http_500 3"
    )
    assert plan.status.preflight is not None
    assert plan.status.preflight.summary == summary
    assert plan.status.completion_time == "2026-05-01T12:00:00Z"
    assert any(e.type == "Warning" and e.reason == "PreflightFailed" for e in plan.events)


def test_preflight_crash_output_is_kept_when_it_is_not_json() -> None:
    first = step(Observed(pool=pool()))
    failed = job("grpo-preflight", ("Failed", "BackoffLimitExceeded"))
    crash = "gymkube-preflight: error: cannot read the task table: refused"
    plan = step(
        Observed(pool=pool(), preflight_job=failed, preflight_messages={"preflight": crash}),
        first.status,
    )
    assert plan.status.preflight is not None
    assert plan.status.preflight.message == crash
    assert crash in next(c.message for c in plan.status.conditions if c.type == "Failed")


def test_disabled_preflight_goes_straight_to_training() -> None:
    plan = step(Observed(pool=pool()), preflight={"enabled": False})
    assert created(plan) == [("ConfigMap", "grpo-agent-loop"), ("Job", "grpo-train")]
    assert condition(plan, "PreflightPassed") == ("True", "PreflightDisabled")


def started(**fields: Any) -> TrainingRunStatus:
    return step(Observed(pool=pool()), preflight={"enabled": False}, **fields).status


def test_active_job_is_running_with_its_start_time() -> None:
    running = job("grpo-train", active=1, ready=1, startTime="2026-05-01T11:59:00Z")
    plan = step(Observed(pool=pool(), training=running), started())
    assert plan.status.phase == Phase.RUNNING
    assert condition(plan, "Running") == ("True", "TrainingRunning")
    assert plan.status.start_time == "2026-05-01T11:59:00Z"
    assert plan.create == []


def test_a_pending_pod_is_starting_not_running() -> None:
    pending = job("grpo-train", active=1, ready=0)
    plan = step(Observed(pool=pool(), training=pending), started())
    assert plan.status.phase == Phase.STARTING
    assert condition(plan, "Running") == ("False", "Starting")
    assert plan.status.start_time is None


UNSCHEDULABLE_POD = {
    "metadata": {"name": "grpo-train-x"},
    "status": {
        "phase": "Pending",
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/1 nodes are available: 1 Insufficient nvidia.com/gpu.",
            }
        ],
    },
}
UNPULLABLE_POD = {
    "metadata": {"name": "grpo-train-x"},
    "status": {
        "phase": "Pending",
        "containerStatuses": [
            {
                "name": "trainer",
                "restartCount": 0,
                "state": {
                    "waiting": {
                        "reason": "ImagePullBackOff",
                        "message": 'Back-off pulling image "reg/trainer:1"',
                    }
                },
            }
        ],
    },
}


@pytest.mark.parametrize(
    ("pod", "reason", "words"),
    [
        (UNSCHEDULABLE_POD, "Unschedulable", "Insufficient nvidia.com/gpu"),
        (UNPULLABLE_POD, "ImagePullFailed", "reg/trainer:1"),
    ],
    ids=["unschedulable", "image-pull"],
)
def test_a_trainer_pod_that_cannot_start_says_why_while_the_run_waits(
    pod: Object, reason: str, words: str
) -> None:
    pending = job("grpo-train", active=1, ready=0)
    plan = step(Observed(pool=pool(), training=pending, trainer_pod=pod), started())
    assert plan.status.phase == Phase.STARTING
    running = next(c for c in plan.status.conditions if c.type == "Running")
    assert running.status.value == "False"
    assert "trainer pod grpo-train-x cannot start" in running.message
    assert words in running.message
    # A Warning Event says it once, not at every pass while it lasts.
    assert [(e.type, e.reason, e.message) for e in plan.events] == [
        ("Warning", reason, running.message)
    ]
    again = step(Observed(pool=pool(), training=pending, trainer_pod=pod), plan.status)
    assert again.events == []


def test_a_trainer_that_finished_is_running_until_the_job_is_complete() -> None:
    finishing = job(
        "grpo-train", ("SuccessCriteriaMet", "CompletionsReached"), ready=0, succeeded=1
    )
    plan = step(Observed(pool=pool(), training=finishing), started())
    assert plan.status.phase == Phase.RUNNING
    assert condition(plan, "Running") == ("True", "TrainingRunning")
    assert condition(plan, "Succeeded") == ("False", "Running")


def test_a_trainer_pod_that_succeeded_is_running_before_the_job_counts_it() -> None:
    # The Job controller counts a finished pod a moment after the pod itself says Succeeded.
    counting = job("grpo-train", active=1, ready=0)
    pod = {"metadata": {"name": "grpo-train-x"}, "status": {"phase": "Succeeded"}}
    plan = step(Observed(pool=pool(), training=counting, trainer_pod=pod), started())
    assert plan.status.phase == Phase.RUNNING
    assert condition(plan, "Running") == ("True", "TrainingRunning")


def test_a_trainer_that_exited_0_in_a_pod_still_running_is_running() -> None:
    # Between the trainer's exit and the pod's Succeeded, the pod is Running and not ready.
    counting = job("grpo-train", active=1, ready=0)
    exited = {"name": "trainer", "ready": False, "state": {"terminated": {"exitCode": 0}}}
    pod = {
        "metadata": {"name": "grpo-train-x"},
        "status": {"phase": "Running", "containerStatuses": [exited]},
    }
    plan = step(Observed(pool=pool(), training=counting, trainer_pod=pod), started())
    assert plan.status.phase == Phase.RUNNING
    assert condition(plan, "Running") == ("True", "TrainingRunning")


def test_failed_job_fails_the_run_with_the_jobs_reason() -> None:
    failed = job("grpo-train", ("Failed", "BackoffLimitExceeded"))
    plan = step(Observed(pool=pool(), training=failed), started())
    assert plan.status.phase == Phase.FAILED
    assert condition(plan, "Failed") == ("True", "BackoffLimitExceeded")
    assert condition(plan, "Running") == ("False", "Failed")
    assert condition(plan, "Succeeded") == ("False", "Failed")
    (event,) = plan.events
    assert (event.type, event.reason) == ("Warning", "BackoffLimitExceeded")


def test_complete_job_succeeds() -> None:
    done = job("grpo-train", ("Complete", "Completed"), completionTime="2026-05-01T11:58:00Z")
    plan = step(Observed(pool=pool(), training=done), started())
    assert condition(plan, "Succeeded") == ("True", "TrainingSucceeded")
    assert plan.status.completion_time == "2026-05-01T11:58:00Z"


def test_a_finished_run_is_a_record_that_never_creates_again() -> None:
    done = step(Observed(pool=pool(), training=job("grpo-train", ("Complete", "C"))), started())
    again = step(Observed(pool=None), done.status)
    assert again.create == []
    assert again.events == []
    assert again.status.conditions == done.status.conditions


def test_ttl_counts_from_completion() -> None:
    done = step(
        Observed(pool=pool(), training=job("grpo-train", ("Complete", "C"))),
        started(),
        ttlSecondsAfterFinished=60,
    )
    assert done.wake_after == 60
    assert not done.delete_expired
    later = NOW + datetime.timedelta(seconds=61)
    expired = step(Observed(pool=None), done.status, now=later, ttlSecondsAfterFinished=60)
    assert expired.delete_expired


def test_suspend_before_the_child_holds_everything() -> None:
    plan = step(Observed(pool=pool()), suspend=True)
    assert plan.create == []
    assert plan.status.phase == Phase.SUSPENDED
    assert condition(plan, "Suspended") == ("True", "Suspended")


def test_suspend_and_resume_a_running_child() -> None:
    running = job("grpo-train", active=1, ready=1)
    plan = step(Observed(pool=pool(), training=running), started(), suspend=True)
    assert plan.suspend_child is True
    suspended = job("grpo-train", ("Suspended", "JobSuspended"), suspend=True)
    plan = step(Observed(pool=pool(), training=suspended), plan.status, suspend=True)
    assert plan.suspend_child is None
    assert condition(plan, "Suspended") == ("True", "Suspended")
    assert plan.status.phase == Phase.SUSPENDED
    resumed = step(Observed(pool=pool(), training=suspended), plan.status)
    assert resumed.suspend_child is False


def test_queued_child_waits_for_kueue_and_resume_is_kueues_call() -> None:
    plan = step(Observed(pool=pool()), preflight={"enabled": False}, queueName="gpu")
    assert plan.status.phase == Phase.QUEUED
    child = plan.create[1]
    assert child["spec"]["suspend"] is True
    waiting = step(Observed(pool=pool(), training=child), plan.status, queueName="gpu")
    assert condition(waiting, "Suspended") == ("True", "WaitingForAdmission")
    assert waiting.suspend_child is None


def test_pool_going_away_mid_run_is_reported_but_the_child_keeps_running() -> None:
    running = job("grpo-train", active=1, ready=1)
    before = step(Observed(pool=pool(), training=running), started())
    plan = step(Observed(pool=pool(ready=False), training=running), before.status)
    assert plan.status.phase == Phase.RUNNING
    assert condition(plan, "EnvPoolReady") == ("False", "EnvPoolNotReady")
    assert [(e.type, e.reason) for e in plan.events] == [("Warning", "EnvPoolNotReady")]


def test_several_nodes_without_kuberay_fail_creating_nothing() -> None:
    plan = step(Observed(pool=pool(), rayjob_served=False), nodes=2)
    assert plan.create == []
    assert condition(plan, "Failed") == ("True", "RayJobCRDMissing")
    assert "KubeRay" in next(c.message for c in plan.status.conditions if c.type == "Failed")


def test_several_nodes_with_kuberay_create_a_rayjob_and_follow_it() -> None:
    plan = step(Observed(pool=pool(), rayjob_served=True), nodes=2, preflight={"enabled": False})
    assert created(plan) == [("ConfigMap", "grpo-agent-loop"), ("RayJob", "grpo-train")]
    running = step(Observed(pool=pool(), training=rayjob("Running", "RUNNING")), plan.status)
    assert running.status.phase == Phase.RUNNING
    failed = step(
        Observed(pool=pool(), training=rayjob("Failed", "FAILED", reason="DeadlineExceeded")),
        running.status,
    )
    assert condition(failed, "Failed") == ("True", "DeadlineExceeded")
    ok = step(Observed(pool=pool(), training=rayjob("Complete", "SUCCEEDED")), running.status)
    assert condition(ok, "Succeeded") == ("True", "TrainingSucceeded")


# RayJobs as KubeRay v1.5.0 wrote them in the e2e suite (a two-node CPU run admitted by Kueue, and a
# two-node run given a model path that does not exist), their specs trimmed to what the run reads;
# and the logs of KubeRay's submitter pod for each (the succeeded one cut to its last lines).
KUBERAY = Path(__file__).parent / "kuberay"
RAYJOBS: dict[str, Object] = json.loads((KUBERAY / "rayjobs.json").read_text())


def test_a_rayjob_as_kuberay_moves_it_is_queued_starting_running_then_succeeded() -> None:
    run = {"nodes": 2, "device": "cpu", "queueName": "training"}
    created = step(Observed(pool=pool(), rayjob_served=True), preflight={"enabled": False}, **run)
    seen = {}
    status = created.status
    for state in ("queued", "initializing", "pending", "running", "finishing", "succeeded"):
        status = step(Observed(pool=pool(), training=RAYJOBS[state]), status, **run).status
        seen[state] = status.phase
    assert seen == {
        "queued": Phase.QUEUED,
        "initializing": Phase.STARTING,
        "pending": Phase.RUNNING,
        "running": Phase.RUNNING,
        # The Ray job is done; KubeRay has yet to say the RayJob is.
        "finishing": Phase.RUNNING,
        "succeeded": Phase.SUCCEEDED,
    }
    assert status.start_time == RAYJOBS["succeeded"]["status"]["startTime"]
    assert status.completion_time == RAYJOBS["succeeded"]["status"]["endTime"]


def test_a_rayjob_runs_progress_is_read_from_kuberays_submitter_pod() -> None:
    log = (KUBERAY / "submitter-succeeded.log").read_text()
    run = {"nodes": 2, "device": "cpu"}
    submitter = {"metadata": {"name": "two-nodes-train-5xk2q"}}
    observed = Observed(
        pool=pool(), training=RAYJOBS["running"], trainer_pod=submitter, trainer_log=log
    )
    plan = step(observed, **run)
    assert plan.status.progress is not None
    assert (plan.status.progress.step, plan.status.progress.total_steps) == (2, 2)
    assert plan.status.progress.mean_reward == 0.25
    assert lifecycle.reads_progress(plan.status)
    assert plan.status.history is not None
    assert [s.step for s in plan.status.history.steps] == [1, 2]


def test_a_failed_rayjob_says_kuberays_reason_and_the_trainers_own_line() -> None:
    log = (KUBERAY / "submitter-failed.log").read_text()
    run = {"nodes": 2, "device": "cpu"}
    plan = step(Observed(pool=pool(), training=RAYJOBS["failed"], trainer_log=log), **run)
    assert condition(plan, "Failed") == ("True", "AppFailed")
    message = next(c.message for c in plan.status.conditions if c.type == "Failed")
    assert message == (
        "RayJob wrong-model-train failed: error: model path /models/SmolLM2-1.7B does not exist "
        "(/models holds: SmolLM2-135M-Instruct)"
    )
    # Without the log, KubeRay's own first line, not the head's whole log tail it carries.
    bare = step(Observed(pool=pool(), training=RAYJOBS["failed"]), **run)
    message = next(c.message for c in bare.status.conditions if c.type == "Failed")
    assert message.startswith("RayJob wrong-model-train failed: Job entrypoint command failed")
    assert "\n" not in message
    assert len(message) <= MAX_LINE + 40


def test_last_transition_time_moves_only_when_status_changes() -> None:
    first = step(Observed(pool=None))
    later = NOW + datetime.timedelta(minutes=5)
    second = step(Observed(pool=None), first.status, now=later)
    before = {c.type: c.last_transition_time for c in first.status.conditions}
    after = {c.type: c.last_transition_time for c in second.status.conditions}
    assert before == after
    assert second.events == []


def test_rejected_child_fails_the_run_with_the_api_servers_words() -> None:
    plan = step(Observed(pool=pool()), preflight={"enabled": False})
    rejected = lifecycle.rejected(
        plan.status, plan.create[1], "422: spec.template.spec.volumes[4].name: Duplicate", 3, NOW
    )
    assert condition(rejected, "Failed") == ("True", "ChildRejected")
    assert rejected.status.training is None
    assert "Duplicate" in next(c.message for c in rejected.status.conditions if c.type == "Failed")


def message(plan: Plan, type_: str) -> str:
    return next(c.message for c in plan.status.conditions if c.type == type_)


def trainer_image(plan: Plan) -> str:
    image: str = plan.create[1]["spec"]["template"]["spec"]["containers"][0]["image"]
    return image


def test_a_cpu_run_takes_the_cpu_trainer_image_and_says_it_trains_on_cpu() -> None:
    gpu = step(Observed(pool=pool()), preflight={"enabled": False}, gpusPerNode=2)
    assert trainer_image(gpu) == "reg/trainer:1"
    assert "1 x 2 GPUs" in message(gpu, "Running")
    cpu = step(Observed(pool=pool()), preflight={"enabled": False}, device="cpu")
    assert trainer_image(cpu) == "reg/trainer-cpu:1"
    assert message(cpu, "Running").startswith("created Job grpo-train: on CPU, grpo on /models/q")
    assert "GPU" not in message(cpu, "Running")
    own = step(Observed(pool=pool()), preflight={"enabled": False}, device="cpu", image="mine:2")
    assert trainer_image(own) == "mine:2"


def progress_line(step: int, **fields: Any) -> str:
    return "gymkube-progress " + json.dumps({"step": step, **fields})


def test_progress_is_the_last_progress_line_of_the_log() -> None:
    log = "\n".join(
        [
            progress_line(1, totalSteps=4, meanReward=0.0),
            "(TaskRunner pid=7) step:2 - critic/score/mean:0.5 ...",
            progress_line(2, totalSteps=4, meanReward=0.5, etaSeconds=62.4),
            "gymkube-progress {not json",
            'gymkube-progress ["a list"]',
            'gymkube-progress {"totalSteps": 4}',
            'a line that mentions gymkube-progress {"step": 9} later on',
            "",
        ]
    )
    found = readings.parse_progress(log)
    assert found == TrainingProgress(step=2, total_steps=4, mean_reward=0.5, eta_seconds=62.4)
    assert readings.parse_progress("no progress yet\n") is None
    assert readings.parse_progress(None) is None


def test_every_field_of_a_progress_line_but_the_step_may_be_null_or_absent() -> None:
    line = progress_line(
        1,
        totalSteps=2,
        meanReward=0.25,
        stepSeconds=31.2,
        generationSeconds=12.0,
        updateSeconds=15.1,
        etaSeconds=31.2,
        checkpointStep=1,
        checkpoint="/checkpoints/run/global_step_1",
        time="2026-12-01T10:00:00Z",
    )
    full = readings.parse_progress(line)
    assert full is not None
    assert full.to_api() == json.loads(line.removeprefix("gymkube-progress "))
    bare = readings.parse_progress(progress_line(3, meanReward=None, etaSeconds=None))
    assert bare == TrainingProgress(step=3)
    assert readings.parse_progress(progress_line(-1)) is None
    assert readings.parse_progress('gymkube-progress {"step": 1, "meanReward": NaN}') is None


def running_job() -> Object:
    return job("grpo-train", active=1, ready=1, startTime="2026-05-01T11:59:00Z")


def test_a_running_job_shows_its_progress_and_never_an_older_step() -> None:
    assert lifecycle.reads_progress(started()) is False
    at_two = step(
        Observed(pool=pool(), training=running_job(), trainer_log=progress_line(2, totalSteps=5)),
        started(),
    )
    assert at_two.status.progress == TrainingProgress(step=2, total_steps=5)
    assert lifecycle.reads_progress(at_two.status)
    # A retried pod starts again from its checkpoint, at an earlier step; an unreadable log says
    # nothing: either way the status keeps the newest step.
    for log in (progress_line(1, totalSteps=5), None, "starting"):
        kept = step(Observed(pool=pool(), training=running_job(), trainer_log=log), at_two.status)
        assert kept.status == at_two.status
    at_three = step(
        Observed(pool=pool(), training=running_job(), trainer_log=progress_line(3)), at_two.status
    )
    assert at_three.status.progress == TrainingProgress(step=3)
    assert at_three.events == []


def test_progress_is_read_once_more_from_the_finished_job() -> None:
    running = step(
        Observed(pool=pool(), training=running_job(), trainer_log=progress_line(1)), started()
    )
    done = job("grpo-train", ("Complete", "Completed"))
    finished = step(
        Observed(pool=pool(), training=done, trainer_log=progress_line(2, checkpointStep=2)),
        running.status,
    )
    assert finished.status.progress == TrainingProgress(step=2, checkpoint_step=2)
    assert not lifecycle.reads_progress(finished.status)


def test_a_merge_patch_of_the_status_removes_progress_fields_no_longer_reported() -> None:
    status = TrainingRunStatus(progress=TrainingProgress(step=2, total_steps=5))
    patch = status.to_patch()
    assert patch["progress"]["step"] == 2
    assert patch["progress"]["etaSeconds"] is None
    assert "progress" not in TrainingRunStatus().to_patch()


def trainer_pod(terminated: dict[str, Any] | None, memory: str | None = "14Gi") -> Object:
    limits = {"memory": memory} if memory else {}
    return {
        "metadata": {"name": "grpo-train-abcde"},
        "spec": {"containers": [{"name": "trainer", "resources": {"limits": limits}}]},
        "status": {
            "containerStatuses": [
                {"name": "trainer", "state": {"terminated": terminated} if terminated else {}}
            ]
        },
    }


def failed_with(pod: Object | None, reason: str = "BackoffLimitExceeded") -> Plan:
    failed = job("grpo-train", ("Failed", reason))
    return step(Observed(pool=pool(), training=failed, trainer_pod=pod), started())


def test_a_failed_trainer_says_why_in_its_own_last_line() -> None:
    said = (
        "Traceback (most recent call last):\n  ...\nValueError:   batch size 3   is not divisible"
    )
    plan = failed_with(trainer_pod({"exitCode": 1, "reason": "Error", "message": said}))
    assert condition(plan, "Failed") == ("True", "TrainerFailed")
    assert message(plan, "Failed") == (
        "Job grpo-train failed: the trainer exited with code 1: "
        "ValueError: batch size 3 is not divisible"
    )
    (event,) = plan.events
    assert (event.type, event.reason) == ("Warning", "TrainerFailed")


def test_a_long_trainer_line_is_cut_to_one_readable_line() -> None:
    plan = failed_with(trainer_pod({"exitCode": 2, "message": "RuntimeError: " + "x" * 5000}))
    line = message(plan, "Failed").split("code 2: ", 1)[1]
    assert len(line) == MAX_LINE
    assert line.startswith("RuntimeError: xxx")
    assert line.endswith("…")
    assert "\n" not in message(plan, "Failed")


def test_a_trainer_killed_for_memory_says_so_with_its_limit() -> None:
    plan = failed_with(trainer_pod({"exitCode": 137, "reason": "OOMKilled"}))
    assert condition(plan, "Failed") == ("True", "TrainerOutOfMemory")
    assert message(plan, "Failed") == (
        "Job grpo-train failed: the trainer was killed for memory (OOMKilled) "
        "at its memory limit of 14Gi"
    )
    unlimited = failed_with(trainer_pod({"exitCode": 137, "reason": "OOMKilled"}, memory=None))
    assert "no memory limit set" in message(unlimited, "Failed")


def test_the_jobs_own_failure_reason_wins_over_the_trainers_exit() -> None:
    # The Job controller killed the trainer at its deadline: that is the cause, not the exit code.
    pod = trainer_pod({"exitCode": 137, "reason": "Error", "message": "step 7 of 10"})
    plan = failed_with(pod, reason="DeadlineExceeded")
    assert condition(plan, "Failed") == ("True", "DeadlineExceeded")
    assert message(plan, "Failed") == (
        "Job grpo-train failed: Failed because DeadlineExceeded; the trainer's last line: "
        "step 7 of 10"
    )
    # No pod (deleted, or never started): the Job's words alone.
    assert condition(failed_with(None), "Failed") == ("True", "BackoffLimitExceeded")
    assert condition(failed_with(trainer_pod(None)), "Failed") == ("True", "BackoffLimitExceeded")


def degraded_pool(reason: str, message: str) -> Object:
    stuck = pool(ready=False, reason="ServersNotReady")
    stuck["status"]["conditions"].append(
        {"type": "Degraded", "status": "True", "reason": reason, "message": message}
    )
    return stuck


def test_a_pool_degraded_for_good_is_named_in_the_runs_own_condition() -> None:
    crash = "pod sciworld-0: exited with code 2, 3 restarts: gymkube-envserver: unknown game"
    waiting = step(Observed(pool=pool(ready=False, reason="ServersNotReady")))
    plan = step(Observed(pool=degraded_pool("ServerCrashLoop", crash)), waiting.status)
    assert plan.create == []
    assert plan.status.phase == Phase.WAITING_FOR_ENV_POOL
    assert condition(plan, "EnvPoolReady") == ("False", Reason.ENV_POOL_DEGRADED)
    assert (
        message(plan, "EnvPoolReady") == f"EnvPool sciworld is Degraded (ServerCrashLoop: {crash})"
    )
    # The change of reason is an Event too, though the condition stays False.
    assert [(e.type, e.reason) for e in plan.events] == [("Warning", "EnvPoolDegraded")]
    # Failing probes are the watchdog's to fix: still only not Ready.
    probing = step(Observed(pool=degraded_pool("ProbesFailing", "failing probes: sciworld-0")))
    assert condition(probing, "EnvPoolReady") == ("False", "EnvPoolNotReady")


def test_a_run_fails_when_its_pool_is_not_ready_within_its_timeout() -> None:
    stuck = Observed(pool=degraded_pool("ImagePullFailed", "pod sciworld-0: cannot pull image x"))
    first = step(stuck, envPoolTimeoutSeconds=600)
    almost = step(
        stuck, first.status, NOW + datetime.timedelta(seconds=599), envPoolTimeoutSeconds=600
    )
    assert almost.status.phase == Phase.WAITING_FOR_ENV_POOL
    late = NOW + datetime.timedelta(seconds=600)
    plan = step(stuck, almost.status, late, envPoolTimeoutSeconds=600)
    assert plan.create == []
    assert plan.status.phase == Phase.FAILED
    assert condition(plan, "Failed") == ("True", Reason.ENV_POOL_TIMEOUT)
    assert message(plan, "Failed") == (
        "waited 600s (envPoolTimeoutSeconds: 600) for its pool; last seen: EnvPool sciworld is "
        "Degraded (ImagePullFailed: pod sciworld-0: cannot pull image x)"
    )
    assert [(e.type, e.reason) for e in plan.events] == [("Warning", "EnvPoolTimeout")]
    # The default is half an hour; a missing pool times out as well.
    missing = step(Observed(pool=None))

    def after(seconds: int) -> Phase:
        later = NOW + datetime.timedelta(seconds=seconds)
        return step(Observed(pool=None), missing.status, later).status.phase

    assert (after(1799), after(1800)) == (Phase.WAITING_FOR_ENV_POOL, Phase.FAILED)


def test_a_suspended_run_waits_for_its_pool_without_a_timeout() -> None:
    first = step(Observed(pool=None), suspend=True)
    later = step(Observed(pool=None), first.status, NOW + datetime.timedelta(days=2), suspend=True)
    assert later.status.phase == Phase.WAITING_FOR_ENV_POOL


def test_the_pool_timeout_is_bounded() -> None:
    for value in (0, 59, 604801):
        with pytest.raises(ValidationError, match="envPoolTimeoutSeconds"):
            spec(envPoolTimeoutSeconds=value)


def test_an_override_verl_refuses_fails_the_run_before_anything_exists() -> None:
    problem = OverrideProblem(0, "trainer.total_epoch=3", "spec.overrides[0] ...: did you mean?")
    # Not even the pool is waited for: no waiting makes it compose.
    plan = step(Observed(pool=None, override_problem=problem), overrides=["trainer.total_epoch=3"])
    assert plan.create == []
    assert plan.status.phase == Phase.FAILED
    assert condition(plan, "Failed") == ("True", Reason.INVALID_OVERRIDE)
    assert message(plan, "Failed") == problem.message
    assert [(e.type, e.reason) for e in plan.events] == [("Warning", "InvalidOverride")]
    ready = step(Observed(pool=pool(), override_problem=problem))
    assert ready.create == []


def test_the_preflight_summary_is_one_line_in_the_condition_and_whole_in_the_status() -> None:
    summary = {
        "ok": False,
        "env": "sciworld",
        "episodes": 8,
        "endings": {"done": 5, "max_turns": 2, "env_lost": 1},
        "env_errors": {"session_lost": 1},
        "failures": [{"data_idx": 3, "ending": "env_lost", "detail": "410: backend\ngone"}],
        "latency_ms": {
            "create": {"p50": 3.2, "p90": 9.0},
            "step": {"p50": 11.7, "p90": 40.0},
            "close": {},
        },
        "mean_score": 0.4375,
        "mean_steps": 12.5,
    }
    assert readings.preflight_line(summary) == (
        "8 episodes (done 5, max_turns 2, env_lost 1); mean score 0.44; p50 ms: create 3, step 12; "
        "env errors: session_lost 1; first failure: task 3 env_lost: gone"
    )
    # Whatever the summary holds, the line is short and one line.
    odd = {
        "episodes": 2,
        "endings": "many",
        "latency_ms": [1],
        "mean_score": "high",
        "x": "y" * 9000,
    }
    assert readings.preflight_line(odd) == "2 episodes; env errors: none"
    first = step(Observed(pool=pool()))
    failed = job("grpo-preflight", ("Failed", "BackoffLimitExceeded"))
    plan = step(
        Observed(
            pool=pool(), preflight_job=failed, preflight_messages={"preflight": json.dumps(summary)}
        ),
        first.status,
    )
    assert "\n" not in message(plan, "PreflightPassed")
    assert plan.status.preflight is not None
    assert plan.status.preflight.summary == summary


def test_a_preflight_log_tail_is_one_line_in_the_condition() -> None:
    first = step(Observed(pool=pool()))
    failed = job("grpo-preflight", ("Failed", "BackoffLimitExceeded"))
    tail = "Traceback (most recent call last):\n  File x\nConnectionRefusedError: refused\n"
    plan = step(
        Observed(pool=pool(), preflight_job=failed, preflight_messages={"preflight": tail}),
        first.status,
    )
    assert message(plan, "Failed") == (
        "preflight Job grpo-preflight failed: ConnectionRefusedError: refused"
    )
    assert plan.status.preflight is not None
    assert plan.status.preflight.message == tail.strip()


# Restarts: the training Job retries a disrupted trainer in a new pod (its podFailurePolicy); the
# run follows the trainer's pod, records why one ended and the step the next resumed from.


def a_pod(
    name: str,
    *,
    phase: str = "Running",
    created: str = "2026-05-01T11:00:00Z",
    exit_code: int | None = None,
    disruption: tuple[str, str] | None = None,
    deleted: bool = False,
    **terminated: Any,
) -> Object:
    """A trainer pod as the kubelet and the controllers leave it."""
    state = {"running": {}}
    if exit_code is not None:
        state = {"terminated": {"exitCode": exit_code, "finishedAt": "2026-05-01T11:58:00Z"}}
        state["terminated"].update(terminated)
    conditions = []
    if disruption is not None:
        reason, said = disruption
        conditions.append(
            {
                "type": "DisruptionTarget",
                "status": "True",
                "reason": reason,
                "message": said,
                "lastTransitionTime": "2026-05-01T11:57:00Z",
            }
        )
    metadata: dict[str, Any] = {"name": name, "creationTimestamp": created}
    if deleted:
        metadata["deletionTimestamp"] = "2026-05-01T11:57:30Z"
    return {
        "metadata": metadata,
        "status": {
            "phase": phase,
            "conditions": conditions,
            "containerStatuses": [{"name": "trainer", "state": state}],
        },
    }


def replacing_job(*conditions: tuple[str, str], **status: Any) -> Object:
    return job(
        "grpo-train", *conditions, active=1, ready=0, startTime="2026-05-01T11:00:00Z", **status
    )


def running_on(
    pod: Object, previous: TrainingRunStatus, log: str | None = None, **fields: Any
) -> Plan:
    return step(
        Observed(pool=pool(), training=running_job(), trainer_pod=pod, trainer_log=log),
        previous,
        **fields,
    )


def test_an_evicted_trainer_is_restarted_and_the_run_stays_running() -> None:
    first = running_on(a_pod("grpo-train-a"), started())
    assert first.status.trainer_pod == "grpo-train-a"
    assert first.status.restarts is not None
    assert first.status.restarts.count == 0
    # A drain evicts it: Kubernetes marks it DisruptionTarget and deletes it.
    evicting = a_pod(
        "grpo-train-a",
        disruption=("EvictionByEvictionAPI", "Eviction API: evicting"),
        deleted=True,
    )
    evicted = step(
        Observed(pool=pool(), training=replacing_job(), trainer_pod=evicting), first.status
    )
    assert evicted.status.phase == Phase.RUNNING
    assert condition(evicted, "Running") == ("True", "TrainerRestarting")
    assert condition(evicted, "Failed") == ("False", "Running")
    restarts = evicted.status.restarts
    assert restarts is not None
    assert restarts.count == 1
    (restart,) = restarts.recent
    assert (restart.pod, restart.reason, restart.time) == (
        "grpo-train-a",
        "Evicted",
        "2026-05-01T11:57:00Z",
    )
    assert restart.message == "pod grpo-train-a was evicted (Eviction API: evicting)"
    assert restart.resumed_from_step is None
    assert message(evicted, "Running") == (
        "Job grpo-train restarts its trainer: pod grpo-train-a was evicted (Eviction API: evicting)"
    )
    (event,) = evicted.events
    assert (event.type, event.reason) == ("Warning", "Evicted")
    assert event.message.startswith("pod grpo-train-a was evicted (Eviction API: evicting); ")

    # The pod is gone, the Job made another: the same restart, counted once, no new Event.
    pending = a_pod("grpo-train-b", phase="Pending", created="2026-05-01T11:58:00Z")
    replaced = step(
        Observed(pool=pool(), training=replacing_job(), trainer_pod=pending), evicted.status
    )
    assert replaced.status.trainer_pod == "grpo-train-b"
    assert replaced.status.restarts == restarts
    assert condition(replaced, "Running") == ("True", "TrainerRestarting")
    assert replaced.events == []

    # The new trainer resumed from its checkpoint: the restart says from which step.
    line = progress_line(5, resumedFromStep=4)
    back = running_on(a_pod("grpo-train-b", created="2026-05-01T11:58:00Z"), replaced.status, line)
    assert condition(back, "Running") == ("True", "TrainingRunning")
    assert back.status.restarts is not None
    assert back.status.restarts.recent[0].resumed_from_step == 4
    assert back.status.progress is not None
    assert back.status.progress.resumed_from_step == 4
    assert back.events == []


@pytest.mark.parametrize(
    ("cause", "reason"),
    [
        ("EvictionByEvictionAPI", "Evicted"),
        ("PreemptionByScheduler", "Preempted"),
        ("DeletionByPodGC", "NodeLost"),
        ("DeletionByTaintManager", "NodeTainted"),
        ("TerminationByKubelet", "TerminatedByKubelet"),
        ("SomethingNew", "Disrupted"),
    ],
)
def test_each_disruption_is_named_from_the_pods_disruption_target(cause: str, reason: str) -> None:
    first = running_on(a_pod("grpo-train-a"), started())
    ended = a_pod("grpo-train-a", phase="Failed", exit_code=75, disruption=(cause, "said so"))
    plan = step(Observed(pool=pool(), training=replacing_job(), trainer_pod=ended), first.status)
    assert plan.status.restarts is not None
    (restart,) = plan.status.restarts.recent
    assert restart.reason == reason
    assert restart.message.endswith("(said so)")


def test_a_deleted_trainer_is_named_by_gymkube_trains_exit_code_or_its_deletion() -> None:
    first = running_on(a_pod("grpo-train-a"), started())
    stopped = a_pod("grpo-train-a", phase="Failed", exit_code=75)
    by_exit = step(
        Observed(pool=pool(), training=replacing_job(), trainer_pod=stopped), first.status
    )
    assert by_exit.status.restarts is not None
    (restart,) = by_exit.status.restarts.recent
    assert restart.reason == "Deleted"
    assert restart.message == (
        "pod grpo-train-a was deleted: gymkube-train stopped the trainer on SIGTERM (exit code 75)"
    )
    assert restart.time == "2026-05-01T11:58:00Z"
    # Seen while it still stops: its deletion says it.
    stopping = a_pod("grpo-train-a", deleted=True)
    by_deletion = step(
        Observed(pool=pool(), training=replacing_job(), trainer_pod=stopping), first.status
    )
    assert by_deletion.status.restarts is not None
    (restart,) = by_deletion.status.restarts.recent
    assert (restart.reason, restart.message) == ("Deleted", "pod grpo-train-a was deleted")


def test_a_failure_the_job_retries_is_a_restart_once_the_job_replaced_the_pod() -> None:
    first = running_on(a_pod("grpo-train-a"), started(), backoffLimit=1)
    failed = a_pod(
        "grpo-train-a", phase="Failed", exit_code=1, message="RuntimeError: NCCL timeout"
    )
    # The Job may still give up (backoffLimit): no restart yet, the run still Running.
    waiting = step(
        Observed(pool=pool(), training=replacing_job(), trainer_pod=failed),
        first.status,
        backoffLimit=1,
    )
    assert waiting.status.restarts == first.status.restarts
    assert condition(waiting, "Running") == ("True", "TrainerRestarting")
    assert message(waiting, "Running") == "Job grpo-train restarts its trainer"
    retried = step(
        Observed(
            pool=pool(),
            training=replacing_job(failed=1),
            trainer_pod=a_pod("grpo-train-b", phase="Pending"),
            earlier_trainer_pods=(failed,),
        ),
        waiting.status,
        backoffLimit=1,
    )
    assert retried.status.restarts is not None
    (restart,) = retried.status.restarts.recent
    assert (restart.reason, restart.message) == (
        "TrainerFailed",
        "pod grpo-train-a: the trainer exited with code 1: RuntimeError: NCCL timeout",
    )
    oom = a_pod("grpo-train-a", phase="Failed", exit_code=137, reason="OOMKilled")
    killed = step(
        Observed(
            pool=pool(),
            training=replacing_job(failed=1),
            trainer_pod=a_pod("grpo-train-b", phase="Pending"),
            earlier_trainer_pods=(oom,),
        ),
        first.status,
        backoffLimit=1,
    )
    assert killed.status.restarts is not None
    assert killed.status.restarts.recent[0].reason == "TrainerOutOfMemory"


def test_a_trainer_that_fails_for_good_fails_the_run_and_is_no_restart() -> None:
    first = running_on(a_pod("grpo-train-a"), started())
    failed = a_pod("grpo-train-a", phase="Failed", exit_code=1, message="ValueError: bad batch")
    plan = step(
        Observed(
            pool=pool(),
            training=job("grpo-train", ("Failed", "BackoffLimitExceeded")),
            trainer_pod=failed,
        ),
        first.status,
    )
    assert condition(plan, "Failed") == ("True", "TrainerFailed")
    assert plan.status.restarts == first.status.restarts
    # A Job stopping its pods on its way to Failed (its deadline) restarts nothing either.
    deadline = job("grpo-train", ("FailureTarget", "DeadlineExceeded"), active=1, ready=0)
    stopping = step(
        Observed(pool=pool(), training=deadline, trainer_pod=a_pod("grpo-train-a", deleted=True)),
        first.status,
    )
    assert stopping.status.restarts == first.status.restarts


def test_a_bad_input_fails_the_job_at_once_with_the_trainers_words() -> None:
    # The FailJob rule on gymkube-train's EXIT_BAD_INPUT: the Job's reason is PodFailurePolicy.
    said = "model path /models/q does not exist (/models holds: SmolLM2-135M-Instruct)"
    plan = failed_with(
        trainer_pod({"exitCode": 2, "reason": "Error", "message": said}), "PodFailurePolicy"
    )
    assert condition(plan, "Failed") == ("True", "TrainerFailed")
    assert (
        message(plan, "Failed") == f"Job grpo-train failed: the trainer exited with code 2: {said}"
    )


def test_a_pod_gone_before_the_operator_saw_why_is_still_a_restart() -> None:
    first = running_on(a_pod("grpo-train-a"), started())
    plan = step(
        Observed(
            pool=pool(),
            training=replacing_job(),
            trainer_pod=a_pod("grpo-train-b", phase="Pending"),
        ),
        first.status,
    )
    assert plan.status.restarts is not None
    (restart,) = plan.status.restarts.recent
    assert (restart.reason, restart.time) == ("PodGone", "2026-05-01T12:00:00Z")


def test_a_suspended_job_stops_its_trainer_which_resumes_with_the_job() -> None:
    first = running_on(a_pod("grpo-train-a"), started())
    # Kueue (or spec.suspend) suspended the Job; the Job controller deleted the pod.
    suspended = job("grpo-train", ("Suspended", "JobSuspended"), suspend=True)
    plan = step(Observed(pool=pool(), training=suspended), first.status, suspend=True)
    assert plan.status.phase == Phase.SUSPENDED
    assert plan.status.restarts is not None
    (restart,) = plan.status.restarts.recent
    assert (restart.reason, restart.message) == (
        "Suspended",
        "pod grpo-train-a was stopped: the Job was suspended",
    )


def test_the_trainer_pod_is_the_one_that_has_not_stopped() -> None:
    # Creation times tie within a second: the Job's one pod that has not stopped is the trainer's.
    old = a_pod("grpo-train-a", phase="Failed", exit_code=75, created="2026-05-01T11:00:00Z")
    new = a_pod("grpo-train-b", phase="Pending", created="2026-05-01T11:00:00Z")
    older = a_pod("grpo-train-0", phase="Failed", exit_code=1, created="2026-05-01T10:00:00Z")
    for pods in ([old, new, older], [new, older, old]):
        current, earlier = restarts.trainer_pods(pods)
        assert current is new
        assert earlier == [old, older]
    assert restarts.trainer_pods([old, older]) == (old, [older])
    assert restarts.trainer_pods([]) == (None, [])


def test_the_status_keeps_the_last_restarts_and_counts_them_all() -> None:
    status = started()
    pod = a_pod("grpo-train-0")
    status = running_on(pod, status).status
    for n in range(1, RECENT_RESTARTS + 3):
        gone = a_pod(f"grpo-train-{n - 1}", phase="Failed", exit_code=75)
        status = step(
            Observed(
                pool=pool(),
                training=replacing_job(),
                trainer_pod=a_pod(f"grpo-train-{n}", phase="Pending"),
                earlier_trainer_pods=(gone,),
            ),
            status,
        ).status
    assert status.restarts is not None
    assert status.restarts.count == RECENT_RESTARTS + 2
    assert [r.pod for r in status.restarts.recent] == [
        f"grpo-train-{n}" for n in range(2, RECENT_RESTARTS + 2)
    ]
    patch = status.to_patch()
    assert patch["restarts"]["count"] == RECENT_RESTARTS + 2
    assert patch["trainerPod"] == f"grpo-train-{RECENT_RESTARTS + 2}"


def test_a_custom_loop_waits_for_its_config_map_and_says_so() -> None:
    custom = {"className": "my_loops.Loop", "configMap": "my-loops"}
    fields = {"preflight": {"enabled": False}, "customAgentLoop": custom}
    waiting = step(Observed(pool=pool(), custom_loop_code_found=False), **fields)
    assert waiting.create == []
    assert waiting.status.phase == "Pending"
    assert "ConfigMap my-loops (customAgentLoop.configMap)" in waiting.status.conditions[-1].message
    (event,) = [e for e in waiting.events if e.reason == "AgentLoopCodeNotFound"]
    assert event.type == "Warning"
    found = step(Observed(pool=pool(), custom_loop_code_found=True), waiting.status, **fields)
    assert created(found) == [("ConfigMap", "grpo-agent-loop"), ("Job", "grpo-train")]
