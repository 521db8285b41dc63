"""What Kueue says of a queued run, in words: its Workload's conditions and its place in the queue.

Kueue makes one Workload per Job or RayJob it manages (labelled with the child's uid), holds the
child suspended until the Workload is admitted, and suspends it again when it evicts the Workload
(a preemption, for one). Its visibility API gives a pending Workload's position in its LocalQueue.
Pure functions; the reads are the handlers'.
"""

import dataclasses
from urllib.parse import quote

from gymkube_operator.conditions import one_line
from gymkube_operator.objects import Object
from gymkube_operator.trainingrun.readings import object_condition, true_condition
from gymkube_operator.trainingrun.reasons import Reason
from gymkube_operator.trainingrun.render import training_name

KUEUE_GROUP, KUEUE_VERSION = "kueue.x-k8s.io", "v1beta2"
KUEUE_API = f"{KUEUE_GROUP}/{KUEUE_VERSION}"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
VISIBILITY_API = "visibility.kueue.x-k8s.io/v1beta2"


@dataclasses.dataclass(frozen=True)
class Admission:
    """Kueue's Workload for the training child (None when Kueue has made none, or is not
    installed) and its 0-based position in its LocalQueue (None when Kueue does not say)."""

    workload: Object | None = None
    position: int | None = None


def runs_owning(workload: Object) -> list[str]:
    """The runs whose training child (a Job or RayJob `<run>-train`) owns this Workload."""
    suffix = training_name("")
    return [
        name[: -len(suffix)]
        for ref in workload.get("metadata", {}).get("ownerReferences") or []
        if ref.get("kind") in ("Job", "RayJob")
        and len(name := str(ref.get("name", ""))) > len(suffix)
        and name.endswith(suffix)
    ]


def workload_selector(child: Object) -> str:
    return f"{JOB_UID_LABEL}={child['metadata']['uid']}"


def pending_workloads_path(namespace: str, queue: str) -> str:
    """The visibility API's pending Workloads of a LocalQueue, in queue order."""
    return (
        f"/apis/{VISIBILITY_API}/namespaces/{quote(namespace)}"
        f"/localqueues/{quote(queue)}/pendingworkloads"
    )


def position_in(pending: Object, workload: Object) -> int | None:
    name = workload["metadata"]["name"]
    for item in pending.get("items") or []:
        if (item.get("metadata") or {}).get("name") == name:
            position = item.get("positionInLocalQueue")
            return int(position) if position is not None else None
    return None


def _said(condition: Object) -> str:
    reason, message = condition.get("reason") or "", one_line(condition.get("message")) or ""
    return f"{reason}: {message}" if reason and message else reason or message


def waiting(admission: Admission, queue: str, what: str) -> tuple[str, str]:
    """(reason, message) of a run whose child Kueue holds suspended."""
    workload = admission.workload
    place = "" if admission.position is None else f", position {admission.position + 1}"
    where = f"Kueue LocalQueue {queue}{place}"
    if workload is None:
        return Reason.WAITING_FOR_ADMISSION, f"{what} waits for Kueue to admit it from {where}"
    evicted = true_condition(workload, "Evicted")
    reserved = object_condition(workload, "QuotaReserved")
    if evicted is not None:
        if evicted.get("reason") == "Preempted":
            return (
                Reason.PREEMPTED,
                f"{what} was preempted by Kueue ({_said(evicted)}); it waits in {where} to be "
                "admitted again and then resumes from its newest checkpoint",
            )
        return (
            Reason.WAITING_FOR_ADMISSION,
            f"{what} was evicted by Kueue ({_said(evicted)}); it waits in {where}",
        )
    if reserved is not None and reserved.get("status") == "True":
        admitted = object_condition(workload, "Admitted")
        said = "" if admitted is None else f" ({_said(admitted)})"
        return (
            Reason.WAITING_FOR_ADMISSION,
            f"{what} has quota in {where} and waits for Kueue's admission checks{said}",
        )
    said = "" if reserved is None else f": {_said(reserved)}"
    return Reason.WAITING_FOR_ADMISSION, f"{what} waits in {where}{said}"
