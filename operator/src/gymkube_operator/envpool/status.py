"""Pure status computation: what exists (children, probes, restarts) in, EnvPool status out."""

import dataclasses

from gymkube_operator.conditions import Condition, ConditionStatus, set_condition
from gymkube_operator.envpool.builders import pool_url, selector_string
from gymkube_operator.envpool.models import EnvPoolSpec, EnvPoolStatus, RestartsStatus
from gymkube_operator.envpool.pods import PodTrouble, degradation
from gymkube_operator.envpool.reasons import ConditionType, Degraded
from gymkube_operator.envpool.watchdog import PodObservation
from gymkube_operator.objects import Object

READY = ConditionType.READY
PROGRESSING = ConditionType.PROGRESSING
DEGRADED = ConditionType.DEGRADED


@dataclasses.dataclass(frozen=True)
class Observed:
    """What the operator saw of one pool's children and pods."""

    statefulset: Object | None
    router: Object | None
    pods: list[PodObservation] = dataclasses.field(default_factory=list)
    # Why pods are not coming up (envpool.pods), from the same look at them.
    troubles: list[PodTrouble] = dataclasses.field(default_factory=list)
    budget_exhausted: bool = False
    apply_error: str | None = None


def _workload(obj: Object | None) -> tuple[int, int, int, bool]:
    """(replicas, ready, updated, controller caught up) of a StatefulSet or Deployment."""
    if obj is None:
        return 0, 0, 0, False
    status = obj.get("status", {})
    caught_up = status.get("observedGeneration", 0) >= obj["metadata"].get("generation", 1)
    if obj["kind"] == "StatefulSet":
        revision_done = status.get("currentRevision") == status.get("updateRevision")
        caught_up = caught_up and revision_done
    return (
        status.get("replicas", 0),
        status.get("readyReplicas", 0),
        status.get("updatedReplicas", 0),
        caught_up,
    )


def _ready(
    spec: EnvPoolSpec, ready: int, router_ready: int, observed: Observed
) -> tuple[ConditionStatus, str, str]:
    if spec.suspend:
        return ConditionStatus.FALSE, "Suspended", "the pool is suspended (spec.suspend)"
    if observed.statefulset is None or observed.router is None:
        return ConditionStatus.FALSE, "ChildrenMissing", "the pool's children are being created"
    if spec.replicas == 0 and spec.autoscaling is not None:
        return (
            ConditionStatus.FALSE,
            "ScaledToZero",
            "scaled to zero: no run uses the pool and no session was open for "
            "idleTimeoutSeconds; a run that uses it scales it up",
        )
    if spec.replicas == 0:
        return ConditionStatus.FALSE, "NoReplicas", "spec.replicas is 0"
    if ready < spec.replicas:
        return (
            ConditionStatus.FALSE,
            "ServersNotReady",
            f"{ready}/{spec.replicas} env servers ready",
        )
    if router_ready == 0:
        return ConditionStatus.FALSE, "RouterNotReady", "no session router is ready"
    message = f"{ready}/{spec.replicas} env servers and {router_ready} routers ready"
    return ConditionStatus.TRUE, "AllReplicasReady", message


def _progressing(
    spec: EnvPoolSpec, observed: Observed, wanted: int
) -> tuple[ConditionStatus, str, str]:
    replicas, ready, updated, caught_up = _workload(observed.statefulset)
    router_replicas, _, router_updated, router_caught_up = _workload(observed.router)
    if observed.statefulset is None or observed.router is None:
        return ConditionStatus.TRUE, "Creating", "creating the pool's children"
    if "observedGeneration" not in observed.statefulset.get("status", {}):
        return ConditionStatus.TRUE, "Creating", "the StatefulSet controller has not acted yet"
    if not caught_up or updated < wanted:
        return ConditionStatus.TRUE, "RollingOut", f"{updated}/{wanted} env servers updated"
    if replicas != wanted or ready < wanted:
        return ConditionStatus.TRUE, "Scaling", f"{ready}/{wanted} env servers ready"
    wanted_routers = 0 if spec.suspend else spec.router.replicas
    if not router_caught_up or router_updated < wanted_routers or router_replicas != wanted_routers:
        return ConditionStatus.TRUE, "RollingOutRouter", "the session router is rolling out"
    return ConditionStatus.FALSE, "Complete", "the pool matches its spec"


def _degraded(observed: Observed) -> tuple[ConditionStatus, str, str]:
    if observed.apply_error:
        return ConditionStatus.TRUE, Degraded.APPLY_FAILED, observed.apply_error
    if (found := degradation(observed.troubles)) is not None:
        return ConditionStatus.TRUE, *found
    if observed.budget_exhausted:
        return (
            ConditionStatus.TRUE,
            Degraded.RESTART_BUDGET_EXHAUSTED,
            "the watchdog restarted too many pods recently and is backing off",
        )
    failing = [p.name for p in observed.pods if p.probe and p.probe.failure]
    if failing:
        message = f"failing probes: {', '.join(failing)}"
        return ConditionStatus.TRUE, Degraded.PROBES_FAILING, message
    return ConditionStatus.FALSE, Degraded.HEALTHY, "no failures seen"


def compute_status(
    *,
    name: str,
    namespace: str,
    generation: int,
    spec: EnvPoolSpec,
    previous: EnvPoolStatus,
    observed: Observed,
    restarts: RestartsStatus | None = None,
    now: str,
) -> EnvPoolStatus:
    replicas, ready, _, _ = _workload(observed.statefulset)
    _, router_ready, _, _ = _workload(observed.router)
    wanted = 0 if spec.suspend else spec.replicas
    active = sum(p.probe.active for p in observed.pods if p.probe and not p.probe.failure)
    conditions: list[Condition] = list(previous.conditions)
    for kind, (status, reason, message) in (
        (READY, _ready(spec, ready, router_ready, observed)),
        (PROGRESSING, _progressing(spec, observed, wanted)),
        (DEGRADED, _degraded(observed)),
    ):
        conditions = set_condition(
            conditions,
            type=kind,
            status=status,
            reason=reason,
            message=message,
            generation=generation,
            now=now,
        )
    return EnvPoolStatus(
        replicas=replicas,
        ready_replicas=ready,
        capacity=ready * spec.sessions_per_replica,
        active_sessions=active,
        url=pool_url(name, namespace, spec.port),
        selector=selector_string(name),
        observed_generation=generation,
        restarts=restarts or previous.restarts,
        conditions=conditions,
    )
