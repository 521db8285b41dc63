"""Why env-server pods are not coming up, read from what the scheduler and the kubelet wrote on
them (pod status, and the kubelet's Events for startup-probe kills). Pure functions: the watchdog
hands in pods from its index and the few Events it read.
"""

import collections
import dataclasses
from collections.abc import Sequence

from gymkube_operator.conditions import cut, one_line
from gymkube_operator.envpool.builders import ENVSERVER_CONTAINER
from gymkube_operator.envpool.reasons import Degraded
from gymkube_operator.objects import Object

IMAGE_PULL_WAITING = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"}
)
CREATE_WAITING = frozenset(
    {"CreateContainerConfigError", "CreateContainerError", "RunContainerError"}
)
CRASH_LOOP_WAITING = "CrashLoopBackOff"
# Error exits, restarted, that make a crash loop before the kubelet itself says CrashLoopBackOff.
CRASH_RESTARTS = 2
# gymkube-envserver prints this, then why, before it exits on a setting or env it refuses.
SERVER_ERROR_PREFIX = "gymkube-envserver:"
# The kubelet's Events (reason Killing, reason Unhealthy) when a startup probe fails.
STARTUP_KILL = "failed startup probe"
STARTUP_FAILED = "Startup probe failed:"
# A tie between reasons shown by the first in this order: the earliest obstacle to a running pod.
ORDER = (
    Degraded.UNSCHEDULABLE,
    Degraded.IMAGE_PULL_FAILED,
    Degraded.CONTAINER_CREATE_FAILED,
    Degraded.OUT_OF_MEMORY,
    Degraded.STARTUP_PROBE_FAILING,
    Degraded.SERVER_CRASH_LOOP,
)


@dataclasses.dataclass(frozen=True)
class PodTrouble:
    pod: str
    reason: Degraded
    detail: str


def error_line(message: str | None) -> str | None:
    """The server's own error, as one line, from a termination message (or the log tail that
    FallbackToLogsOnError puts there): from its last `gymkube-envserver:` line on, else the last
    line (a traceback's exception)."""
    lines = [line for line in (message or "").splitlines() if line.strip()]
    for index in range(len(lines) - 1, -1, -1):
        if lines[index].startswith(SERVER_ERROR_PREFIX):
            return cut(" ".join(" ".join(lines[index:]).split()))
    return one_line(message)


def _slim_terminated(terminated: Object | None) -> Object | None:
    if not terminated:
        return None
    kept: Object = {
        k: terminated[k]
        for k in ("exitCode", "reason", "startedAt", "finishedAt")
        if k in terminated
    }
    if line := error_line(terminated.get("message")):
        kept["message"] = line
    return kept


def _slim_container(status: Object) -> Object:
    state = status.get("state") or {}
    slim_state: Object = {"running": {}} if "running" in state else {}
    if waiting := state.get("waiting"):
        slim_state["waiting"] = {
            "reason": waiting.get("reason"),
            "message": one_line(waiting.get("message")),
        }
    if terminated := _slim_terminated(state.get("terminated")):
        slim_state["terminated"] = terminated
    slim: Object = {
        "name": status.get("name"),
        "image": status.get("image"),
        "started": status.get("started", False),
        "restartCount": status.get("restartCount", 0),
        "state": slim_state,
    }
    if last := _slim_terminated((status.get("lastState") or {}).get("terminated")):
        slim["lastState"] = {"terminated": last}
    return slim


def slim_pod(pod: Object) -> Object:
    """What the watchdog reads of a pod, in the pod's own shape: the pods index keeps only this,
    to bound the operator's memory."""
    meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
    return {
        "metadata": {
            k: meta[k]
            for k in ("name", "namespace", "uid", "creationTimestamp", "deletionTimestamp")
            if k in meta
        },
        "spec": {
            "containers": [
                {
                    "name": c.get("name"),
                    "resources": {
                        "limits": {
                            k: v
                            for k, v in ((c.get("resources") or {}).get("limits") or {}).items()
                            if k == "memory"
                        }
                    },
                }
                for c in spec.get("containers") or []
            ]
        },
        "status": {
            "phase": status.get("phase"),
            "podIP": status.get("podIP"),
            "conditions": [
                {k: c.get(k) for k in ("type", "status", "reason", "message")}
                for c in status.get("conditions") or []
                if c.get("type") == "PodScheduled"
            ],
            "initContainerStatuses": [
                _slim_container(c) for c in status.get("initContainerStatuses") or []
            ],
            "containerStatuses": [
                _slim_container(c) for c in status.get("containerStatuses") or []
            ],
        },
    }


def _statuses(pod: Object) -> list[Object]:
    status = pod.get("status") or {}
    return [
        *(status.get("initContainerStatuses") or []),
        *(status.get("containerStatuses") or []),
    ]


def _up(container: Object) -> bool:
    return "running" in (container.get("state") or {}) and bool(container.get("started"))


def _last_termination(container: Object) -> Object:
    state = container.get("state") or {}
    terminated: Object = (
        state.get("terminated") or (container.get("lastState") or {}).get("terminated") or {}
    )
    return terminated


def startup_suspect(pod: Object) -> bool:
    """Whether the pod has a container that was restarted and is not up again for a reason its
    status does not tell (a startup-probe kill looks like any exit): its Events may tell."""
    return not pod["metadata"].get("deletionTimestamp") and any(
        c.get("restartCount", 0) > 0
        and not _up(c)
        and _last_termination(c).get("reason") != "OOMKilled"
        for c in _statuses(pod)
    )


def _event_time(event: Object) -> str:
    stamp = event.get("lastTimestamp") or event.get("eventTime") or event.get("firstTimestamp")
    return str(stamp or "")[:19]  # seconds, as container start and finish times are written


def startup_probe_output(container: str, last: Object, events: Sequence[Object]) -> str | None:
    """The startup probe's last failure, if the kubelet killed this container for failing its
    startup probe during its last run (between the run's start and finish)."""
    started, finished = str(last.get("startedAt", ""))[:19], str(last.get("finishedAt", ""))[:19]
    mine = [
        e
        for e in events
        if (e.get("involvedObject") or {}).get("fieldPath") == f"spec.containers{{{container}}}"
    ]
    killed = any(
        e.get("reason") == "Killing"
        and STARTUP_KILL in (e.get("message") or "")
        and started <= _event_time(e) <= finished
        for e in mine
    )
    if not killed:
        return None
    failures = sorted(
        (e for e in mine if (e.get("message") or "").startswith(STARTUP_FAILED)), key=_event_time
    )
    return one_line(failures[-1].get("message")) if failures else STARTUP_KILL


def _memory_limit(pod: Object, container: str) -> str | None:
    for spec in (pod.get("spec") or {}).get("containers") or []:
        if spec.get("name") == container:
            limit = ((spec.get("resources") or {}).get("limits") or {}).get("memory")
            return None if limit is None else str(limit)
    return None


def _container_trouble(
    pod: Object, container: Object, events: Sequence[Object]
) -> tuple[Degraded, str] | None:
    name = str(container.get("name"))
    waiting = (container.get("state") or {}).get("waiting") or {}
    why = waiting.get("reason")
    said = one_line(waiting.get("message")) or why
    if why in IMAGE_PULL_WAITING:
        return Degraded.IMAGE_PULL_FAILED, f"cannot pull image {container.get('image')}: {said}"
    if why in CREATE_WAITING:
        return Degraded.CONTAINER_CREATE_FAILED, f"{why}: {said}"
    last = _last_termination(container)
    if _up(container) or not last:
        return None
    restarts = container.get("restartCount", 0)
    if last.get("reason") == "OOMKilled":
        limit = _memory_limit(pod, name)
        where = (
            f"at its memory limit of {limit}"
            if limit
            else "with no memory limit (its node ran out)"
        )
        return Degraded.OUT_OF_MEMORY, f"killed for memory (OOMKilled) {where}, {restarts} restarts"
    if restarts and (probe := startup_probe_output(name, last, events)) is not None:
        return (
            Degraded.STARTUP_PROBE_FAILING,
            f"restarted {restarts} times for failing its startup probe: {probe}",
        )
    code = last.get("exitCode", 0)
    if why == CRASH_LOOP_WAITING or (code != 0 and restarts >= CRASH_RESTARTS):
        line = error_line(last.get("message"))
        output = f": {line}" if line else "; it printed nothing (kubectl logs --previous)"
        return Degraded.SERVER_CRASH_LOOP, f"exited with code {code}, {restarts} restarts{output}"
    return None


def pod_trouble(pod: Object, events: Sequence[Object] = ()) -> PodTrouble | None:
    """Why this pod's env server is not coming up, if its status says; None when it is up or on
    its way (pending, pulling, starting)."""
    meta, status = pod["metadata"], pod.get("status") or {}
    name = meta["name"]
    if meta.get("deletionTimestamp"):
        return None
    for condition in status.get("conditions") or []:
        if (condition.get("type"), condition.get("status"), condition.get("reason")) == (
            "PodScheduled",
            "False",
            "Unschedulable",
        ):
            said = one_line(condition.get("message")) or "no node fits it"
            return PodTrouble(name, Degraded.UNSCHEDULABLE, f"unschedulable: {said}")
    for container in _statuses(pod):
        found = _container_trouble(pod, container, events)
        if found is not None:
            reason, detail = found
            if container.get("name") != ENVSERVER_CONTAINER:
                detail = f"container {container.get('name')} {detail}"
            return PodTrouble(name, reason, detail)
    return None


def degradation(troubles: Sequence[PodTrouble]) -> tuple[Degraded, str] | None:
    """The Degraded reason and message for the pool: the reason most pods share, one pod's words."""
    if not troubles:
        return None
    counts = collections.Counter(t.reason for t in troubles)
    reason = max(ORDER, key=lambda r: (counts[r], -ORDER.index(r)))
    same = [t for t in troubles if t.reason == reason]
    more = f" (and {len(same) - 1} more)" if len(same) > 1 else ""
    return reason, f"pod {same[0].pod}: {same[0].detail}{more}"
