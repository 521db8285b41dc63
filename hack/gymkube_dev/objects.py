"""Reading plain Kubernetes objects (dicts, as the API server sends them): conditions, whether
the controller caught up, one phrase for a pod or a rollout."""

from typing import Any

from gymkube_operator.envpool.models import EnvPoolSpec

Object = dict[str, Any]
ENVSERVER_PORT: int = EnvPoolSpec.model_fields["port"].default
"""The env servers' port in a pool that does not set spec.port (every example and e2e pool)."""


def condition(obj: Object | None, kind: str) -> Object | None:
    """The metav1.Condition of type KIND in OBJ's status, if any."""
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return None


def condition_is(obj: Object | None, kind: str, status: str = "True") -> bool:
    cond = condition(obj, kind)
    return cond is not None and cond.get("status") == status


def current(obj: Object) -> bool:
    """The controller has acted on the object's latest spec."""
    observed = (obj.get("status") or {}).get("observedGeneration", 0)
    return int(observed) >= int(obj["metadata"].get("generation", 0))


def is_ready(pod: Object) -> bool:
    """Ready and not on its way out."""
    return condition_is(pod, "Ready") and not pod["metadata"].get("deletionTimestamp")


def cpu_cores(quantity: str) -> float:
    return float(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


def pod_state(pod: Object) -> str:
    """One phrase for a pod: its phase, why a container waits, restarts, readiness."""
    status = pod.get("status") or {}
    words = [status.get("phase", "Unknown")]
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            words.append(cond.get("reason", "NotScheduled"))
    for container in status.get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason"):
            words.append(waiting["reason"])
        if container.get("restartCount"):
            words.append(f"{container['restartCount']} restarts")
        if container.get("ready"):
            words.append("ready")
    return f"{pod['metadata']['name']} " + " ".join(words)


def rolled_out(workload: Object | None) -> tuple[bool, str]:
    """A StatefulSet or Deployment whose every replica runs the latest template and is ready."""
    if workload is None:
        return False, "gone"
    status, want = workload.get("status") or {}, workload["spec"].get("replicas", 1)
    updated, ready = status.get("updatedReplicas", 0), status.get("readyReplicas", 0)
    done = (
        current(workload)
        and updated == ready == status.get("replicas", 0) == want
        and status.get("currentRevision") == status.get("updateRevision")  # StatefulSet only
    )
    return done, f"{updated}/{want} on the new template, {ready}/{want} ready"
