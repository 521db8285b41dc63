"""A one-node run's trainer restarts, read as pure functions: which pod runs the trainer, why the
one before it ended, and the step its successor resumed from.

The training Job retries a disrupted trainer without counting it (its podFailurePolicy, in
render.py), so a restart leaves no trace in the Job's status; the pods say it, and only for as
long as they exist (an evicted or deleted pod is gone a moment after it stopped). So the run's
status remembers the pod it follows (`trainerPod`) and records why that pod ended as soon as the
cause is known: while it stops, or at the latest when the Job has replaced it.
"""

from collections.abc import Sequence

from gymkube_operator.conditions import one_line
from gymkube_operator.objects import Object
from gymkube_operator.trainingrun import command, render
from gymkube_operator.trainingrun.models import (
    RECENT_RESTARTS,
    TrainerRestart,
    TrainerRestarts,
    TrainingProgress,
)
from gymkube_operator.trainingrun.readings import container_status, true_condition
from gymkube_operator.trainingrun.reasons import Reason

DISRUPTION_TARGET = "DisruptionTarget"
# The DisruptionTarget reasons Kubernetes sets (1.34: the Eviction API, the scheduler, the pod
# garbage collector, the taint manager, the kubelet), as the run's restart reasons, in words.
DISRUPTIONS: dict[str, tuple[Reason, str]] = {
    "EvictionByEvictionAPI": (Reason.EVICTED, "was evicted"),
    "PreemptionByScheduler": (Reason.PREEMPTED, "was preempted"),
    "DeletionByPodGC": (Reason.NODE_LOST, "lost its node"),
    "DeletionByTaintManager": (Reason.NODE_TAINTED, "was deleted from a tainted node"),
    "TerminationByKubelet": (Reason.TERMINATED_BY_KUBELET, "was stopped by its node's kubelet"),
}
TERMINAL_PHASES = ("Succeeded", "Failed")


def pod_name(pod: Object) -> str:
    name: str = pod["metadata"]["name"]
    return name


def _phase(pod: Object) -> str | None:
    phase: str | None = (pod.get("status") or {}).get("phase")
    return phase


def trainer_pods(pods: Sequence[Object]) -> tuple[Object | None, list[Object]]:
    """(the pod the trainer runs in, the Job's other pods newest first). The Job replaces a pod
    only once it stopped (podReplacementPolicy Failed), so at most one has not: that one, else
    the newest (creation times tie within a second)."""
    ordered = sorted(
        pods,
        key=lambda p: (
            _phase(p) not in TERMINAL_PHASES,
            p["metadata"].get("creationTimestamp", ""),
        ),
        reverse=True,
    )
    return (ordered[0], ordered[1:]) if ordered else (None, [])


def _terminated(pod: Object, container: str = render.TRAINER) -> Object:
    state: Object = (container_status(pod, container) or {}).get("state") or {}
    terminated: Object = state.get("terminated") or {}
    return terminated


def _failed_init_step(pod: Object) -> str | None:
    """`<container> exited with code N: <its last line>` of a dataset step that failed."""
    for status in (pod.get("status") or {}).get("initContainerStatuses") or []:
        terminated = (status.get("state") or {}).get("terminated") or {}
        if terminated.get("exitCode", 0) != 0:
            line = one_line(terminated.get("message"))
            said = f": {line}" if line else ""
            return f"{status.get('name')} exited with code {terminated['exitCode']}{said}"
    return None


def _failure(pod: Object, name: str) -> tuple[Reason, str]:
    """What a pod the Job replaced after a failure it counted says of it."""
    terminated = _terminated(pod)
    if terminated.get("reason") == "OOMKilled":
        return Reason.TRAINER_OUT_OF_MEMORY, f"pod {name}: the trainer was killed for memory"
    if terminated.get("exitCode", 0) != 0:
        line = one_line(terminated.get("message"))
        said = f": {line}" if line else ""
        code = terminated["exitCode"]
        return Reason.TRAINER_FAILED, f"pod {name}: the trainer exited with code {code}{said}"
    status = pod.get("status") or {}
    cause = _failed_init_step(pod) or status.get("message") or status.get("reason")
    return Reason.POD_FAILED, f"pod {name} failed" + (f": {one_line(cause)}" if cause else "")


def ended(
    pod: Object | None, name: str, *, replaced: bool, suspended: bool, now: str
) -> TrainerRestart | None:
    """Why the trainer pod `name` (`pod` while it exists) ended, once that is known: at once for a
    disruption, which the Job retries; for a failure of its own only when the Job replaced it
    (until then the Job may give up instead). None while it runs."""
    if pod is None:
        if suspended:
            message = f"pod {name} was stopped: the Job was suspended"
            return TrainerRestart(pod=name, reason=Reason.SUSPENDED, message=message, time=now)
        if replaced:
            message = f"pod {name} was removed before the operator saw why it ended"
            return TrainerRestart(pod=name, reason=Reason.POD_GONE, message=message, time=now)
        return None
    if _phase(pod) == "Succeeded":
        return None
    terminated = _terminated(pod)
    deleted = pod["metadata"].get("deletionTimestamp")
    when = terminated.get("finishedAt") or deleted or now

    def restart(reason: Reason, message: str, at: str = when) -> TrainerRestart:
        return TrainerRestart(pod=name, reason=reason, message=message, time=at)

    if (disruption := true_condition(pod, DISRUPTION_TARGET)) is not None:
        cause = disruption.get("reason") or ""
        reason, what = DISRUPTIONS.get(cause, (Reason.DISRUPTED, "was disrupted"))
        said = disruption.get("message") or cause
        return restart(
            reason, f"pod {name} {what} ({said})", disruption.get("lastTransitionTime") or when
        )
    stopping = deleted is not None or _phase(pod) == "Failed"
    if suspended and stopping:
        return restart(Reason.SUSPENDED, f"pod {name} was stopped: the Job was suspended")
    if terminated.get("exitCode") == command.TRAINER_EXIT_STOPPED:
        return restart(
            Reason.DELETED,
            f"pod {name} was deleted: {command.TRAIN_WRAPPER} stopped the trainer on SIGTERM "
            f"(exit code {command.TRAINER_EXIT_STOPPED})",
        )
    if deleted is not None:
        return restart(Reason.DELETED, f"pod {name} was deleted")
    if not replaced:
        return None
    return restart(*_failure(pod, name))


def _recorded(restarts: TrainerRestarts, restart: TrainerRestart) -> TrainerRestarts:
    recent = [*restarts.recent, restart][-RECENT_RESTARTS:]
    return restarts.model_copy(update={"count": restarts.count + 1, "recent": recent})


def _resumed(restarts: TrainerRestarts, pod: str, step: int) -> TrainerRestarts:
    """The newest restart, once the pod after it says which step it resumed from."""
    if not restarts.recent:
        return restarts
    last = restarts.recent[-1]
    if last.pod == pod or last.resumed_from_step is not None:
        return restarts
    resumed = last.model_copy(update={"resumed_from_step": step})
    return restarts.model_copy(update={"recent": [*restarts.recent[:-1], resumed]})


def follow(
    restarts: TrainerRestarts,
    followed: str | None,
    pods: Sequence[Object],
    progress: TrainingProgress | None,
    *,
    suspended: bool,
    now: str,
) -> tuple[str | None, TrainerRestarts, TrainerRestart | None]:
    """One look at the training Job's pods: (the pod followed from now on, the restarts, the
    restart this look found, if any). `progress` is the last progress line of the trainer pod's
    log; `suspended`, whether the Job is."""
    current, earlier = trainer_pods(pods)
    found = None
    newest = restarts.recent[-1].pod if restarts.recent else None
    if followed is not None and followed != newest:
        pod = next((p for p in (current, *earlier) if p and pod_name(p) == followed), None)
        replaced = current is not None and pod_name(current) != followed
        found = ended(pod, followed, replaced=replaced, suspended=suspended, now=now)
        if found is not None:
            restarts = _recorded(restarts, found)
    following = pod_name(current) if current is not None else followed
    if following is not None and progress is not None and progress.resumed_from_step is not None:
        restarts = _resumed(restarts, following, progress.resumed_from_step)
    return following, restarts, found
