"""What a queued run says, from Workloads Kueue itself wrote (kueue/workloads.json: captured from
Kueue v0.17.0 in the kind e2e cluster, not written by hand)."""

import json
from pathlib import Path
from typing import Any

import pytest
from gymkube_operator.objects import Object
from gymkube_operator.trainingrun import admission, lifecycle
from gymkube_operator.trainingrun.lifecycle import Observed
from gymkube_operator.trainingrun.models import Phase, TrainingRunSpec, TrainingRunStatus
from gymkube_operator.trainingrun.reasons import Reason
from test_trainingrun_lifecycle import NOW, RUN, condition, job, pool

pytestmark = pytest.mark.unit

CAPTURED: dict[str, Object] = json.loads(
    (Path(__file__).parent / "kueue" / "workloads.json").read_text()
)["workloads"]
QUEUE = "lq"


def queued_step(queued: admission.Admission | None) -> lifecycle.Plan:
    spec = TrainingRunSpec.model_validate(
        {"envPoolRef": {"name": "sciworld"}, "model": {"path": "/m"}, "queueName": QUEUE}
    )
    child = job("grpo-train", suspend=True)
    observed = Observed(pool=pool(), training=child, queued=queued)
    return lifecycle.plan(RUN, spec, TrainingRunStatus(), observed, NOW)


def test_a_run_waiting_for_quota_says_so_with_kueues_reason_and_its_place() -> None:
    plan = queued_step(admission.Admission(CAPTURED["pending"], position=0))
    assert plan.status.phase == Phase.QUEUED
    assert condition(plan, "Suspended") == ("True", Reason.WAITING_FOR_ADMISSION)
    message = next(c.message for c in plan.status.conditions if c.type == "Suspended")
    assert message.startswith("Job grpo-train waits in Kueue LocalQueue lq, position 1: Pending: ")
    assert "insufficient unused quota for cpu in flavor default-flavor, 200m more needed" in message


def test_a_preempted_run_says_who_preempted_it_and_that_it_resumes() -> None:
    plan = queued_step(admission.Admission(CAPTURED["preempted"]))
    assert plan.status.phase == Phase.QUEUED
    assert condition(plan, "Suspended") == ("True", Reason.PREEMPTED)
    message = next(c.message for c in plan.status.conditions if c.type == "Suspended")
    assert "was preempted by Kueue (Preempted: Preempted to accommodate a workload" in message
    assert "resumes from its newest checkpoint" in message
    assert ("Normal", Reason.PREEMPTED) in [(e.type, e.reason) for e in plan.events]


@pytest.mark.parametrize(
    ("queued", "said"),
    [
        (None, "Job grpo-train waits for Kueue to admit it from Kueue LocalQueue lq"),
        (
            admission.Admission(),
            "Job grpo-train waits for Kueue to admit it from Kueue LocalQueue lq",
        ),
    ],
    ids=["no-reading", "kueue-not-installed"],
)
def test_without_a_workload_the_run_still_says_it_waits(
    queued: admission.Admission | None, said: str
) -> None:
    plan = queued_step(queued)
    assert plan.status.phase == Phase.QUEUED
    assert next(c.message for c in plan.status.conditions if c.type == "Suspended") == said


def test_the_place_in_the_queue_is_read_from_kueues_pending_list() -> None:
    workload: dict[str, Any] = CAPTURED["pending"]
    pending = {
        "items": [
            {"metadata": {"name": "other"}, "positionInLocalQueue": 0},
            {"metadata": {"name": workload["metadata"]["name"]}, "positionInLocalQueue": 1},
        ]
    }
    assert admission.position_in(pending, workload) == 1
    assert admission.position_in({"items": []}, workload) is None
    child = {"metadata": {"uid": workload["metadata"]["labels"][admission.JOB_UID_LABEL]}}
    assert admission.workload_selector(child) == (
        f"kueue.x-k8s.io/job-uid={workload['metadata']['labels'][admission.JOB_UID_LABEL]}"
    )
    assert admission.pending_workloads_path("rl", "lq") == (
        "/apis/visibility.kueue.x-k8s.io/v1beta2/namespaces/rl/localqueues/lq/pendingworkloads"
    )


def test_a_workload_wakes_the_run_whose_training_child_owns_it() -> None:
    # Kueue's Workload for a Job that is no run's child wakes nothing...
    workload = CAPTURED["pending"]
    assert admission.runs_owning(workload) == []
    # ...and the same Workload, owned by a run's training Job, wakes that run.
    owner = {**workload["metadata"]["ownerReferences"][0], "name": "grpo-train"}
    owned = {**workload, "metadata": {**workload["metadata"], "ownerReferences": [owner]}}
    assert admission.runs_owning(owned) == ["grpo"]
    assert admission.runs_owning({"metadata": {}}) == []
