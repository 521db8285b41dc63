"""The EvalRun life, one pure reconcile at a time: what is created, and what status says."""

import datetime
import json
from typing import Any

import pytest
from gymkube_operator.conditions import find_condition
from gymkube_operator.evalrun import lifecycle, readings, render
from gymkube_operator.evalrun.lifecycle import Observed, Plan
from gymkube_operator.evalrun.models import EvalRunSpec, EvalRunStatus, Phase
from gymkube_operator.evalrun.reasons import Reason
from gymkube_operator.objects import Object
from gymkube_operator.trainingrun.command import Run
from gymkube_operator.trainingrun.reasons import Reason as TrainingRunReason

pytestmark = pytest.mark.unit

NOW = datetime.datetime(2026, 5, 1, 12, 0, 0, tzinfo=datetime.UTC)
RUN = Run(
    name="score",
    namespace="rl",
    uid="uid-1",
    generation=2,
    trainer_image="reg/trainer:1",
    cpu_trainer_image="reg/trainer-cpu:1",
    preflight_image="reg/preflight:1",
    image_pull_policy="IfNotPresent",
)
URL = "http://lake.rl.svc:8000"
SUMMARY: dict[str, Any] = {
    "model": "/models/base",
    "checkpointStep": None,
    "episodes": 4,
    "successes": 1,
    "successRate": 0.25,
    "successRateInterval": [0.05, 0.7],
    "meanScore": 0.25,
    "meanScoreInterval": [0.0, 0.74],
    "meanTurns": 2.5,
    "envErrors": 0,
    "tasks": [{"task": "frozen_lake_3", "episodes": 4, "successes": 1, "meanScore": 0.25}],
}
WITHOUT_TASKS = {k: v for k, v in SUMMARY.items() if k != "tasks"}


def spec(**fields: Any) -> EvalRunSpec:
    return EvalRunSpec.model_validate(
        {"envPoolRef": {"name": "lake"}, "model": {"path": "/models/base"}, **fields}
    )


def pool(ready: bool = True) -> Object:
    return {
        "metadata": {"name": "lake"},
        "spec": {"env": "frozen_lake"},
        "status": {
            "url": URL,
            "conditions": [
                {"type": "Ready", "status": "True" if ready else "False", "reason": "Starting"}
            ],
        },
    }


PVC = {"persistentVolumeClaim": {"claimName": "ckpt"}}


def training_run(checkpoints: Object | None = PVC) -> Object:
    run_spec: Object = {"envPoolRef": {"name": "lake"}, "model": {"path": "/models/base"}}
    if checkpoints is not None:
        run_spec["checkpoints"] = checkpoints
    return {"metadata": {"name": "lake-grpo"}, "spec": run_spec}


def job(*conditions: tuple[str, str], **status: Any) -> Object:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "score-eval"},
        "status": {
            "conditions": [
                {"type": t, "status": "True", "reason": r, "message": f"{t} because {r}"}
                for t, r in conditions
            ],
            **status,
        },
    }


def pod(exit_code: int | None = None, message: str = "", reason: str = "") -> Object:
    state: Object = {"running": {}}
    if exit_code is not None:
        terminated = {"exitCode": exit_code, "reason": reason or "Error", "message": message}
        state = {"terminated": terminated}
    return {
        "metadata": {"name": "score-eval-x"},
        "spec": {"containers": [{"name": render.EVAL, "resources": {"limits": {"memory": "8Gi"}}}]},
        "status": {"containerStatuses": [{"name": render.EVAL, "state": state}]},
    }


def progress_line(episodes: int, total: int, successes: int, score: float) -> str:
    body = {"episodes": episodes, "total": total, "successes": successes, "meanScore": score}
    return readings.PROGRESS_PREFIX + json.dumps(body)


def condition(plan: Plan, type_: str) -> tuple[str, str, str]:
    found = find_condition(plan.status.conditions, type_)
    assert found is not None, type_
    return found.status.value, found.reason, found.message


def step(
    observed: Observed,
    previous: EvalRunStatus | None = None,
    now: datetime.datetime = NOW,
    **fields: Any,
) -> Plan:
    return lifecycle.plan(RUN, spec(**fields), previous or EvalRunStatus(), observed, now)


def test_an_eval_waits_for_its_pool_and_creates_nothing() -> None:
    plan = step(Observed(pool=None))
    assert plan.create == []
    assert plan.status.phase == Phase.WAITING_FOR_ENV_POOL
    assert condition(plan, "EnvPoolReady")[:2] == ("False", TrainingRunReason.ENV_POOL_NOT_FOUND)
    assert condition(plan, "Running")[:2] == ("False", "WaitingForEnvPool")
    assert plan.status.observed_generation == 2


def test_a_ready_pool_gets_the_config_map_and_the_job_once() -> None:
    plan = step(Observed(pool=pool()))
    assert [(o["kind"], o["metadata"]["name"]) for o in plan.create] == [
        ("ConfigMap", "score-eval-config"),
        ("Job", "score-eval"),
    ]
    status = plan.status
    assert (status.phase, status.job, status.env_pool_url, status.model) == (
        Phase.STARTING,
        "score-eval",
        URL,
        "/models/base",
    )
    assert condition(plan, "EnvPoolReady")[0] == "True"
    again = step(Observed(pool=pool(), job=job()), status)
    assert again.create == []
    assert again.status.phase == Phase.STARTING


def test_a_missing_trainingrun_fails_at_once_with_nothing_created() -> None:
    plan = step(Observed(pool=None), model={"trainingRun": {"name": "lake-grpo"}})
    assert plan.create == []
    assert plan.status.phase == Phase.FAILED
    status, reason, message = condition(plan, "Failed")
    assert (status, reason) == ("True", Reason.TRAINING_RUN_NOT_FOUND)
    assert "TrainingRun lake-grpo does not exist" in message
    assert plan.status.model == "lake-grpo@latest"
    assert [e.type for e in plan.events] == ["Warning"]


@pytest.mark.parametrize("checkpoints", [None, {"emptyDir": {}}], ids=["unset", "emptyDir"])
def test_a_trainingrun_without_a_checkpoints_volume_fails_at_once(
    checkpoints: Object | None,
) -> None:
    observed = Observed(pool=pool(), training_run=training_run(checkpoints))
    plan = step(observed, model={"trainingRun": {"name": "lake-grpo", "step": 2}})
    assert plan.create == []
    status, reason, message = condition(plan, "Failed")
    assert (status, reason) == ("True", Reason.NO_CHECKPOINTS_VOLUME)
    assert "no spec.checkpoints volume" in message
    assert "died with its pod" in message


def test_a_trainingrun_checkpoint_is_described_and_mounted() -> None:
    observed = Observed(pool=pool(), training_run=training_run())
    plan = step(observed, model={"trainingRun": {"name": "lake-grpo", "step": 2}})
    assert plan.status.model == "lake-grpo@2"
    (job_obj,) = [o for o in plan.create if o["kind"] == "Job"]
    volumes = {v["name"] for v in job_obj["spec"]["template"]["spec"]["volumes"]}
    assert "checkpoints" in volumes


def test_progress_lines_are_read_while_it_plays() -> None:
    log = "\n".join(
        [progress_line(1, 4, 0, 0.0), "vllm says hello", progress_line(3, 4, 1, 0.33), "{bad"]
    )
    plan = step(Observed(pool=pool(), job=job(ready=1), pod=pod(), log=log))
    assert plan.status.phase == Phase.RUNNING
    assert condition(plan, "Running")[:2] == ("True", Reason.EVAL_RUNNING)
    assert plan.status.progress is not None
    assert plan.status.progress.model_dump() == {
        "episodes": 3,
        "total": 4,
        "successes": 1,
        "mean_score": 0.33,
    }
    assert lifecycle.reads_progress(plan.status)


def test_a_completed_eval_keeps_its_score_and_writes_the_per_task_results() -> None:
    log = "\n".join([progress_line(4, 4, 1, 0.25), readings.RESULT_PREFIX + json.dumps(SUMMARY)])
    observed = Observed(pool=pool(), job=job(("Complete", "")), pod=pod(0), log=log)
    plan = step(observed)
    assert plan.status.phase == Phase.SUCCEEDED
    status, reason, message = condition(plan, "Succeeded")
    assert (status, reason) == ("True", Reason.EVAL_SUCCEEDED)
    assert "mean score 0.250" in message
    assert "1/4 episodes succeeded" in message
    assert plan.status.result is not None
    assert plan.status.result.to_api() == {k: v for k, v in WITHOUT_TASKS.items() if v is not None}
    assert plan.status.results_config_map == "score-results"
    (results,) = plan.create
    assert json.loads(results["data"][render.TASKS_FILE]) == SUMMARY["tasks"]
    assert plan.status.completion_time == "2026-05-01T12:00:00Z"
    assert lifecycle.is_finished(plan.status)
    # A record from then on: nothing is made again.
    later = step(Observed(pool=None), plan.status, NOW + datetime.timedelta(hours=1))
    assert later.create == []
    assert later.status == plan.status.model_copy(update={"observed_generation": 2})


def test_without_its_log_the_score_comes_from_the_termination_message() -> None:
    message = json.dumps(WITHOUT_TASKS)
    observed = Observed(pool=pool(), job=job(("Complete", "")), pod=pod(0, message), log=None)
    plan = step(observed)
    assert plan.status.phase == Phase.SUCCEEDED
    assert plan.status.result is not None
    assert plan.status.result.mean_score == 0.25
    assert plan.create == []
    assert plan.status.results_config_map is None


def test_a_completed_job_without_any_summary_fails_saying_so() -> None:
    plan = step(Observed(pool=pool(), job=job(("Complete", "")), pod=pod(0), log="done"))
    status, reason, message = condition(plan, "Failed")
    assert (status, reason) == ("True", Reason.NO_RESULT)
    assert "left no summary" in message


def test_a_missing_checkpoint_step_fails_with_gymkube_evals_own_words() -> None:
    said = (
        "TrainingRun checkpoint step 7 not found under /checkpoints/lake-grpo (saved steps: 1, 2)"
    )
    failed = job(("Failed", "PodFailurePolicy"))
    plan = step(Observed(pool=pool(), job=failed, pod=pod(2, said)))
    assert condition(plan, "Failed") == ("True", Reason.INVALID_MODEL, said)
    assert plan.status.phase == Phase.FAILED


def test_a_crash_fails_with_its_last_line() -> None:
    failed = job(("Failed", "BackoffLimitExceeded"))
    plan = step(Observed(pool=pool(), job=failed, pod=pod(1, "Traceback\nValueError: no vllm")))
    status, reason, message = condition(plan, "Failed")
    assert (status, reason) == ("True", Reason.EVAL_FAILED)
    assert message.endswith("exited with code 1: ValueError: no vllm")


def test_a_failed_dataset_step_says_why() -> None:
    failed_pod = pod()
    said = "gymkube-dataset: no test split"
    failed_pod["status"] = {
        "initContainerStatuses": [
            {"name": render.DATASET, "state": {"terminated": {"exitCode": 2, "message": said}}}
        ]
    }
    failed = job(("Failed", "BackoffLimitExceeded"))
    plan = step(Observed(pool=pool(), job=failed, pod=failed_pod))
    assert condition(plan, "Failed") == (
        "True",
        Reason.DATASET_FAILED,
        f"Job score-eval failed: its dataset step exited with code 2: {said}",
    )


def test_an_oom_kill_names_the_limit() -> None:
    failed = job(("Failed", "BackoffLimitExceeded"))
    plan = step(Observed(pool=pool(), job=failed, pod=pod(137, reason="OOMKilled")))
    status, reason, message = condition(plan, "Failed")
    assert (status, reason) == ("True", Reason.EVAL_OUT_OF_MEMORY)
    assert "memory limit of 8Gi" in message


def test_the_jobs_own_reason_when_gymkube_eval_did_not_fail() -> None:
    plan = step(Observed(pool=pool(), job=job(("Failed", "DeadlineExceeded")), pod=pod()))
    assert condition(plan, "Failed")[:2] == ("True", "DeadlineExceeded")


def test_a_pool_not_ready_within_its_timeout_fails_the_eval() -> None:
    waiting = step(Observed(pool=pool(ready=False)))
    later = NOW + datetime.timedelta(seconds=1800)
    plan = step(Observed(pool=pool(ready=False)), waiting.status, later)
    status, reason, message = condition(plan, "Failed")
    assert (status, reason) == ("True", TrainingRunReason.ENV_POOL_TIMEOUT)
    assert "waited 1800s" in message


def test_the_ttl_deletes_a_finished_eval() -> None:
    failed = job(("Failed", "DeadlineExceeded"))
    plan = step(Observed(pool=pool(), job=failed, pod=pod()), ttlSecondsAfterFinished=60)
    assert (plan.delete_expired, plan.wake_after) == (False, 60)
    later = step(
        Observed(pool=None),
        plan.status,
        NOW + datetime.timedelta(seconds=61),
        ttlSecondsAfterFinished=60,
    )
    assert later.delete_expired


def test_a_rejected_child_fails_the_eval_with_the_api_servers_words() -> None:
    planned = step(Observed(pool=pool()))
    job_obj = planned.create[1]
    plan = lifecycle.rejected(planned.status, job_obj, "422: spec.template: Invalid", 2, NOW)
    status, reason, message = condition(plan, "Failed")
    assert (status, reason) == ("True", TrainingRunReason.CHILD_REJECTED)
    assert message == "the API server rejected Job score-eval: 422: spec.template: Invalid"
    assert plan.status.job is None
