"""Status and conditions computed from what exists."""

from typing import Any

import pytest
from gymkube_operator.conditions import ConditionStatus, find_condition
from gymkube_operator.envpool.models import EnvPoolSpec, EnvPoolStatus
from gymkube_operator.envpool.pods import PodTrouble
from gymkube_operator.envpool.reasons import Degraded
from gymkube_operator.envpool.status import Observed, compute_status
from gymkube_operator.envpool.watchdog import Failure, PodObservation, Probe
from pydantic import ValidationError

pytestmark = pytest.mark.unit


def workload(kind: str, replicas: int, ready: int, generation: int = 1) -> dict[str, Any]:
    return {
        "kind": kind,
        "metadata": {"generation": generation},
        "status": {
            "observedGeneration": generation,
            "replicas": replicas,
            "readyReplicas": ready,
            "updatedReplicas": replicas,
            "currentRevision": "r1",
            "updateRevision": "r1",
        },
    }


def status(
    observed: Observed, previous: EnvPoolStatus | None = None, now: str = "T1", **spec: Any
) -> EnvPoolStatus:
    return compute_status(
        name="pool",
        namespace="ns",
        generation=3,
        spec=EnvPoolSpec.model_validate({"env": "frozen_lake", "replicas": 2, **spec}),
        previous=previous or EnvPoolStatus(),
        observed=observed,
        now=now,
    )


def condition(result: EnvPoolStatus, kind: str) -> tuple[ConditionStatus, str]:
    found = find_condition(result.conditions, kind)
    assert found is not None
    return found.status, found.reason


def test_a_fully_ready_pool_is_ready_and_not_progressing() -> None:
    ready = Observed(workload("StatefulSet", 2, 2), workload("Deployment", 1, 1))
    result = status(ready, sessionsPerReplica=8)
    assert condition(result, "Ready") == (ConditionStatus.TRUE, "AllReplicasReady")
    assert condition(result, "Progressing") == (ConditionStatus.FALSE, "Complete")
    assert condition(result, "Degraded") == (ConditionStatus.FALSE, "Healthy")
    assert result.capacity == 16
    assert result.url == "http://pool.ns.svc:8000"
    assert result.selector == "gymkube.io/envpool=pool,app.kubernetes.io/component=envserver"
    assert result.observed_generation == 3
    assert all(c.observed_generation == 3 for c in result.conditions)


def test_pods_not_ready_yet_mean_not_ready_and_progressing() -> None:
    result = status(Observed(workload("StatefulSet", 2, 1), workload("Deployment", 1, 1)))
    assert condition(result, "Ready") == (ConditionStatus.FALSE, "ServersNotReady")
    assert condition(result, "Progressing") == (ConditionStatus.TRUE, "Scaling")


def test_a_suspended_pool_says_so() -> None:
    result = status(
        Observed(workload("StatefulSet", 0, 0), workload("Deployment", 0, 0)), suspend=True
    )
    assert condition(result, "Ready") == (ConditionStatus.FALSE, "Suspended")
    assert condition(result, "Progressing") == (ConditionStatus.FALSE, "Complete")


def test_failing_probes_and_apply_errors_mark_the_pool_degraded() -> None:
    sts, router = workload("StatefulSet", 2, 2), workload("Deployment", 1, 1)
    failing = [PodObservation("pool-1", "u1", 10, False, Probe(Failure.NO_ANSWER, "timeout"))]
    result = status(Observed(sts, router, pods=failing))
    assert condition(result, "Degraded") == (ConditionStatus.TRUE, "ProbesFailing")
    broken = status(Observed(None, None, apply_error="403: forbidden"))
    assert condition(broken, "Degraded") == (ConditionStatus.TRUE, "ApplyFailed")


def test_active_sessions_sum_the_healthy_probes() -> None:
    pods = [
        PodObservation("pool-0", "u0", 10, False, Probe(None, active=3)),
        PodObservation("pool-1", "u1", 10, False, Probe(None, active=4)),
    ]
    result = status(Observed(workload("StatefulSet", 2, 2), workload("Deployment", 1, 1), pods))
    assert result.active_sessions == 7


def test_transition_time_moves_only_when_a_condition_flips() -> None:
    pending = Observed(workload("StatefulSet", 2, 1), workload("Deployment", 1, 1))
    ready = Observed(workload("StatefulSet", 2, 2), workload("Deployment", 1, 1))
    first = status(pending, now="T1")
    same = status(pending, previous=first, now="T2")
    flipped = status(ready, previous=same, now="T3")

    def ready_time(result: EnvPoolStatus) -> str:
        found = find_condition(result.conditions, "Ready")
        assert found is not None
        return found.last_transition_time

    assert ready_time(same) == "T1"
    assert ready_time(flipped) == "T3"


def test_pods_that_do_not_come_up_mark_the_pool_degraded_with_their_cause() -> None:
    sts, router = workload("StatefulSet", 2, 0), workload("Deployment", 1, 1)
    crashing = PodTrouble("pool-0", Degraded.SERVER_CRASH_LOOP, "exited with code 2: bad env")
    result = status(Observed(sts, router, pods=[], troubles=[crashing]))
    degraded = find_condition(result.conditions, "Degraded")
    assert degraded is not None
    assert (degraded.status, degraded.reason) == (ConditionStatus.TRUE, "ServerCrashLoop")
    assert degraded.message == "pod pool-0: exited with code 2: bad env"
    assert degraded.observed_generation == 3
    # The API server refusing a child comes first; the pods' cause before the watchdog's budget.
    refused = status(Observed(None, None, troubles=[crashing], apply_error="422: bad"))
    assert condition(refused, "Degraded") == (ConditionStatus.TRUE, "ApplyFailed")
    spent = status(Observed(sts, router, pods=[], troubles=[crashing], budget_exhausted=True))
    assert condition(spent, "Degraded") == (ConditionStatus.TRUE, "ServerCrashLoop")


def test_a_refused_apply_is_judged_again_by_the_next_pass() -> None:
    sts, router = workload("StatefulSet", 2, 0), workload("Deployment", 1, 1)
    refused = status(Observed(None, None, apply_error="422: bad"), now="T1")
    assert condition(refused, "Degraded") == (ConditionStatus.TRUE, "ApplyFailed")
    applied = status(Observed(sts, router), previous=refused, now="T2")
    assert condition(applied, "Degraded") == (ConditionStatus.FALSE, "Healthy")


def test_a_pool_without_a_ready_router_is_never_ready() -> None:
    servers_up = workload("StatefulSet", 2, 2)
    result = status(Observed(servers_up, workload("Deployment", 1, 0)))
    assert condition(result, "Ready") == (ConditionStatus.FALSE, "RouterNotReady")


def test_a_pool_needs_at_least_one_router_and_bounded_counts() -> None:
    with pytest.raises(ValidationError, match=r"router\.replicas"):
        EnvPoolSpec.model_validate({"env": "frozen_lake", "router": {"replicas": 0}})
    for field, value in (
        ("sessionsPerReplica", 4097),
        ("warmSessionsPerReplica", 4097),
        ("replicas", 1001),
    ):
        with pytest.raises(ValidationError, match=field):
            EnvPoolSpec.model_validate({"env": "frozen_lake", field: value})
