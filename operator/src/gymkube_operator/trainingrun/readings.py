"""What a TrainingRun's pool, Jobs, pods and logs say, read as pure functions: the pool's
readiness, the preflight's summary, the trainer's progress lines and why a trainer failed."""

import datetime
import json
from typing import Any

from pydantic import ValidationError

from gymkube_operator.conditions import (
    Condition,
    ConditionStatus,
    cut,
    find_condition,
    is_reason,
    one_line,
    parse_rfc3339,
)
from gymkube_operator.envpool.reasons import STUCK
from gymkube_operator.envpool.status import DEGRADED as POOL_DEGRADED
from gymkube_operator.envpool.status import READY as POOL_READY
from gymkube_operator.objects import Object
from gymkube_operator.trainingrun import command, render
from gymkube_operator.trainingrun.models import TrainingProgress
from gymkube_operator.trainingrun.reasons import ConditionType, Reason

# What gymkube-train prints on the trainer's stdout after every step: this, then one JSON object.
PROGRESS_PREFIX = "gymkube-progress "


def reason_word(text: str | None, fallback: str) -> str:
    """A condition reason: the child's own when it is CamelCase, else the fallback."""
    return text if text and is_reason(text) else fallback


def true_condition(obj: Object, type_: str) -> Object | None:
    for condition in obj.get("status", {}).get("conditions", []) or []:
        if condition.get("type") == type_ and condition.get("status") == "True":
            found: Object = condition
            return found
    return None


def job_finished(job: Object) -> bool:
    return true_condition(job, "Complete") is not None or true_condition(job, "Failed") is not None


def object_condition(obj: Object, type_: str) -> Object | None:
    """An object's status condition of this type, whatever its status."""
    conditions = (obj.get("status") or {}).get("conditions") or []
    found: Object | None = next((c for c in conditions if c.get("type") == type_), None)
    return found


def pool_state(pool: Object | None, pool_name: str) -> tuple[bool, str, str]:
    """(ready, reason, message) of the referenced EnvPool."""
    if pool is None:
        return (
            False,
            Reason.ENV_POOL_NOT_FOUND,
            f"EnvPool {pool_name} does not exist in this namespace",
        )
    status = pool.get("status", {}) or {}
    if true_condition(pool, POOL_READY) is None:
        degraded = object_condition(pool, POOL_DEGRADED) or {}
        if degraded.get("status") == "True" and degraded.get("reason") in STUCK:
            # Waiting will not make this pool Ready: say why in the pool's own words.
            detail = f"{degraded['reason']}: {degraded.get('message', '')}"
            return False, Reason.ENV_POOL_DEGRADED, f"EnvPool {pool_name} is Degraded ({detail})"
        condition = object_condition(pool, POOL_READY)
        detail = (
            f"{condition.get('reason', '')}: {condition.get('message', '')}"
            if condition
            else "it reports no Ready condition yet"
        )
        return False, Reason.ENV_POOL_NOT_READY, f"EnvPool {pool_name} is not Ready ({detail})"
    if not status.get("url"):
        return (
            False,
            Reason.ENV_POOL_NOT_READY,
            f"EnvPool {pool_name} is Ready but has no status.url",
        )
    return True, Reason.ENV_POOL_READY, f"EnvPool {pool_name} is Ready at {status['url']}"


def pools_state(pools: dict[str, Object | None]) -> tuple[bool, str, str]:
    """(ready, reason, message) of every pool a run plays (by name): Ready when all are; else
    the first one's reason that is not, and the words of each that is not."""
    states = [pool_state(pool, name) for name, pool in pools.items()]
    if len(states) == 1:
        return states[0]
    waiting = [state for state in states if not state[0]]
    if waiting:
        return False, waiting[0][1], "; ".join(message for _, _, message in waiting)
    return True, Reason.ENV_POOL_READY, f"EnvPools {', '.join(pools)} are Ready"


def pool_wait_over(
    conditions: list[Condition], timeout_seconds: int, now: datetime.datetime
) -> float | None:
    """Seconds a run (a TrainingRun, an EvalRun) has waited for its pool, once that is past
    timeout_seconds (its spec.envPoolTimeoutSeconds)."""
    waiting = find_condition(conditions, ConditionType.ENV_POOL_READY)
    if waiting is None or waiting.status != ConditionStatus.FALSE:
        return None
    waited = (now - parse_rfc3339(waiting.last_transition_time)).total_seconds()
    return waited if waited >= timeout_seconds else None


def parse_summary(message: str | None) -> tuple[dict[str, Any] | None, str | None]:
    """(JSON summary, other text) from the preflight's termination message."""
    if not message or not message.strip():
        return None, None
    candidates = [message.strip(), *reversed(message.strip().splitlines())]
    for candidate in candidates:
        try:
            parsed = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(parsed, dict):
            return parsed, None
    return None, message.strip()[-2000:]


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _counts(value: Any) -> str:
    return ", ".join(f"{k} {v}" for k, v in value.items()) if isinstance(value, dict) else ""


def preflight_line(summary: dict[str, Any]) -> str:
    """gymkube-preflight's JSON summary as one line: episodes and how they ended, mean score,
    p50 latency of each call, env errors and the first failure."""
    endings = _counts(summary.get("endings"))
    parts = [f"{summary.get('episodes', '?')} episodes" + (f" ({endings})" if endings else "")]
    if (score := _number(summary.get("mean_score"))) is not None:
        parts.append(f"mean score {score:.2f}")
    latency = summary.get("latency_ms")
    medians = [
        f"{call} {p50:.0f}"
        for call, values in (latency.items() if isinstance(latency, dict) else [])
        if isinstance(values, dict) and (p50 := _number(values.get("p50"))) is not None
    ]
    if medians:
        parts.append(f"p50 ms: {', '.join(medians)}")
    parts.append(f"env errors: {_counts(summary.get('env_errors')) or 'none'}")
    failures = summary.get("failures")
    if isinstance(failures, list) and failures and isinstance(failures[0], dict):
        first = failures[0]
        said = one_line(str(first.get("detail", ""))) or "no detail"
        parts.append(f"first failure: task {first.get('data_idx')} {first.get('ending')}: {said}")
    return cut("; ".join(parts))


def progress_lines(log: str | None) -> list[TrainingProgress]:
    """The well-formed `gymkube-progress {json}` lines of the trainer's log, oldest first."""
    found = []
    for line in (log or "").splitlines():
        line = line.strip()
        if not line.startswith(PROGRESS_PREFIX):
            continue
        try:
            found.append(TrainingProgress.model_validate_json(line.removeprefix(PROGRESS_PREFIX)))
        except ValidationError:
            continue
    return found


def trainer_verdict(log: str | None) -> str | None:
    """gymkube-train's last word in the trainer's log (why the trainer failed, or could not
    start), without its name; None when it said none."""
    prefix = f"{command.TRAIN_WRAPPER}: "
    said = [line.strip() for line in (log or "").splitlines() if line.startswith(prefix)]
    return one_line(said[-1].removeprefix(prefix)) if said else None


def parse_progress(log: str | None) -> TrainingProgress | None:
    """The last well-formed progress line of the trainer's log, if any."""
    return next(reversed(progress_lines(log)), None)


def newer_progress(
    previous: TrainingProgress | None, found: TrainingProgress | None
) -> TrainingProgress | None:
    """What status.progress shows: the found line, unless it is of an earlier step (a retried pod
    starting again from its checkpoint) or there is none."""
    if found is None or (previous is not None and found.step < previous.step):
        return previous
    return found


def container_status(pod: Object | None, name: str) -> Object | None:
    for status in (pod or {}).get("status", {}).get("containerStatuses", []) or []:
        if status.get("name") == name:
            found: Object = status
            return found
    return None


def trainer_started(pod: Object) -> bool:
    """Whether the trainer container has started, so that it has a log to read."""
    state = (container_status(pod, render.TRAINER) or {}).get("state") or {}
    return "running" in state or "terminated" in state


def trainer_exited_cleanly(pod: Object | None) -> bool:
    """Whether the trainer ended with 0: its pod Succeeded, or, a moment before the kubelet says
    so (the pod is still Running, no longer ready), its container terminated with exit code 0."""
    if ((pod or {}).get("status") or {}).get("phase") == "Succeeded":
        return True
    state = (container_status(pod, render.TRAINER) or {}).get("state") or {}
    return (state.get("terminated") or {}).get("exitCode") == 0


def _memory_limit(pod: Object | None) -> str | None:
    for container in (pod or {}).get("spec", {}).get("containers", []) or []:
        if container.get("name") == render.TRAINER:
            limit = ((container.get("resources") or {}).get("limits") or {}).get("memory")
            return None if limit is None else str(limit)
    return None


# The Job failure reasons whose cause is the trainer's own exit.
TRAINER_CAUSED = (None, "BackoffLimitExceeded", "PodFailurePolicy")


def trainer_failure(job: Object, failed: Object, pod: Object | None) -> tuple[str, str]:
    """(reason, message) of a failed training Job: the trainer container's own cause where its
    pod says one (killed for memory, or exited with its last line), else the Job's."""
    name = job["metadata"]["name"]
    state = (container_status(pod, render.TRAINER) or {}).get("state") or {}
    terminated = state.get("terminated") or {}
    line = one_line(terminated.get("message"))
    said = f": {line}" if line else ""
    if terminated.get("reason") == "OOMKilled":
        limit = _memory_limit(pod)
        where = (
            f"at its memory limit of {limit}"
            if limit
            else "with no memory limit set (its node ran out)"
        )
        killed = f"the trainer was killed for memory (OOMKilled) {where}"
        return Reason.TRAINER_OUT_OF_MEMORY, f"Job {name} failed: {killed}"
    job_reason = failed.get("reason")
    # A Job gives up with BackoffLimitExceeded (or PodFailurePolicy: a FailJob rule matched its
    # exit code) because its pods failed: the trainer says why. Other reasons (DeadlineExceeded,
    # ...) are the Job's own doing.
    if terminated.get("exitCode", 0) != 0 and job_reason in TRAINER_CAUSED:
        code = terminated["exitCode"]
        return (
            Reason.TRAINER_FAILED,
            f"Job {name} failed: the trainer exited with code {code}{said}",
        )
    detail = failed.get("message") or job_reason or "no detail"
    last = f"; the trainer's last line: {line}" if line else ""
    return reason_word(job_reason, Reason.TRAINING_FAILED), f"Job {name} failed: {detail}{last}"
