"""The TrainingRun life as one pure function: what exists in, what to create and the status out.

Level-based: every call looks at the pool, the preflight Job and the training child as they are
now, so a restarted operator or a missed event changes nothing.
"""

import dataclasses
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
    now_rfc3339,
    one_line,
    parse_rfc3339,
    set_condition,
)
from gymkube_operator.envpool.reasons import STUCK
from gymkube_operator.envpool.status import DEGRADED as POOL_DEGRADED
from gymkube_operator.envpool.status import READY as POOL_READY
from gymkube_operator.objects import Object
from gymkube_operator.trainingrun import device, render
from gymkube_operator.trainingrun.command import Run, RunTarget
from gymkube_operator.trainingrun.models import (
    ChildRef,
    Phase,
    PreflightStatus,
    TrainingProgress,
    TrainingRunSpec,
    TrainingRunStatus,
)
from gymkube_operator.trainingrun.overrides import OverrideProblem
from gymkube_operator.trainingrun.reasons import ConditionType, Reason

ENV_POOL_READY = ConditionType.ENV_POOL_READY
PREFLIGHT_PASSED = ConditionType.PREFLIGHT_PASSED
RUNNING = ConditionType.RUNNING
SUCCEEDED = ConditionType.SUCCEEDED
FAILED = ConditionType.FAILED
SUSPENDED = ConditionType.SUSPENDED

TRUE, FALSE, UNKNOWN = ConditionStatus.TRUE, ConditionStatus.FALSE, ConditionStatus.UNKNOWN

# Which phase each phase-derived condition is True in.
_PHASE_CONDITIONS = (
    (RUNNING, (Phase.RUNNING,)),
    (SUCCEEDED, (Phase.SUCCEEDED,)),
    (FAILED, (Phase.FAILED,)),
    (SUSPENDED, (Phase.SUSPENDED, Phase.QUEUED)),
)
# What gymkube-train prints on the trainer's stdout after every step: this, then one JSON object.
PROGRESS_PREFIX = "gymkube-progress "


@dataclasses.dataclass(frozen=True)
class Observed:
    """What exists right now."""

    pool: Object | None
    preflight_job: Object | None = None
    # The preflight container's termination message (its JSON summary, or a log tail).
    preflight_message: str | None = None
    training: Object | None = None
    # The training Job's newest pod, and the tail of its trainer container's log once it started.
    trainer_pod: Object | None = None
    trainer_log: str | None = None
    # Whether the API server serves ray.io/v1 RayJob; None when nobody asked (nodes = 1).
    rayjob_served: bool | None = None
    # What verl's config says of spec.overrides; None when they compose (or nobody asked).
    override_problem: OverrideProblem | None = None


@dataclasses.dataclass(frozen=True)
class Event:
    type: str
    reason: str
    message: str


@dataclasses.dataclass
class Plan:
    status: TrainingRunStatus
    create: list[Object] = dataclasses.field(default_factory=list)
    # Set the training child's spec.suspend to this.
    suspend_child: bool | None = None
    delete_run: bool = False
    # Seconds until something is due without any event (the TTL).
    wake_after: float | None = None
    events: list[Event] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class _Outcome:
    """Where the training child is, as one phase with a reason."""

    phase: Phase
    reason: str
    message: str
    start_time: str | None = None
    completion_time: str | None = None


def reason_word(text: str | None, fallback: str) -> str:
    """A condition reason: the child's own when it is CamelCase, else the fallback."""
    return text if text and is_reason(text) else fallback


def reads_progress(status: TrainingRunStatus) -> bool:
    """Whether the run's trainer is running in a one-node Job, whose log holds its progress."""
    return (
        status.phase == Phase.RUNNING
        and status.training is not None
        and status.training.kind == "Job"
    )


def is_finished(status: TrainingRunStatus) -> bool:
    return any(
        (c := find_condition(status.conditions, t)) is not None and c.status == TRUE
        for t in (SUCCEEDED, FAILED)
    )


def _true(obj: Object, type_: str) -> Object | None:
    for condition in obj.get("status", {}).get("conditions", []) or []:
        if condition.get("type") == type_ and condition.get("status") == "True":
            found: Object = condition
            return found
    return None


def job_finished(job: Object) -> bool:
    return _true(job, "Complete") is not None or _true(job, "Failed") is not None


def _pool_condition(pool: Object, type_: str) -> Object | None:
    conditions = (pool.get("status") or {}).get("conditions") or []
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
    if _true(pool, POOL_READY) is None:
        degraded = _pool_condition(pool, POOL_DEGRADED) or {}
        if degraded.get("status") == "True" and degraded.get("reason") in STUCK:
            # Waiting will not make this pool Ready: say why in the pool's own words.
            detail = f"{degraded['reason']}: {degraded.get('message', '')}"
            return False, Reason.ENV_POOL_DEGRADED, f"EnvPool {pool_name} is Degraded ({detail})"
        condition = _pool_condition(pool, POOL_READY)
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


def _seconds_since(timestamp: str, now: datetime.datetime) -> float:
    then = parse_rfc3339(timestamp)
    return (now - then).total_seconds()


def pool_wait_over(
    spec: TrainingRunSpec, status: TrainingRunStatus, now: datetime.datetime
) -> float | None:
    """Seconds the run has waited for its pool, once that is past spec.envPoolTimeoutSeconds."""
    waiting = find_condition(status.conditions, ENV_POOL_READY)
    if waiting is None or waiting.status != FALSE:
        return None
    waited = _seconds_since(waiting.last_transition_time, now)
    return waited if waited >= spec.env_pool_timeout_seconds else None


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


def parse_progress(log: str | None) -> TrainingProgress | None:
    """The last well-formed `gymkube-progress {json}` line of the trainer's log, if any."""
    for line in reversed((log or "").splitlines()):
        line = line.strip()
        if not line.startswith(PROGRESS_PREFIX):
            continue
        try:
            return TrainingProgress.model_validate_json(line.removeprefix(PROGRESS_PREFIX))
        except ValidationError:
            continue
    return None


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


def _memory_limit(pod: Object | None) -> str | None:
    for container in (pod or {}).get("spec", {}).get("containers", []) or []:
        if container.get("name") == render.TRAINER:
            limit = ((container.get("resources") or {}).get("limits") or {}).get("memory")
            return None if limit is None else str(limit)
    return None


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
    # A Job gives up with BackoffLimitExceeded because its pods failed: the trainer says why.
    # Other reasons (DeadlineExceeded, ...) are the Job's own doing.
    if terminated.get("exitCode", 0) != 0 and job_reason in (None, "BackoffLimitExceeded"):
        code = terminated["exitCode"]
        return (
            Reason.TRAINER_FAILED,
            f"Job {name} failed: the trainer exited with code {code}{said}",
        )
    detail = failed.get("message") or job_reason or "no detail"
    last = f"; the trainer's last line: {line}" if line else ""
    return reason_word(job_reason, Reason.TRAINING_FAILED), f"Job {name} failed: {detail}{last}"


def _job_outcome(job: Object, spec: TrainingRunSpec, pod: Object | None) -> _Outcome:
    status = job.get("status", {}) or {}
    name = job["metadata"]["name"]
    start = status.get("startTime")
    if (done := _true(job, "Complete")) is not None:
        return _Outcome(
            Phase.SUCCEEDED,
            Reason.TRAINING_SUCCEEDED,
            f"Job {name} completed",
            start,
            status.get("completionTime") or done.get("lastTransitionTime"),
        )
    if (failed := _true(job, "Failed")) is not None:
        reason, message = trainer_failure(job, failed, pod)
        return _Outcome(Phase.FAILED, reason, message, start, failed.get("lastTransitionTime"))
    if render.child_suspended(job) or _true(job, "Suspended") is not None:
        return _suspended(spec, f"Job {name}")
    # `active` counts pending pods too; a trainer is running once its pod is ready.
    if status.get("ready", 0) > 0:
        return _Outcome(Phase.RUNNING, Reason.TRAINING_RUNNING, f"Job {name} is running", start)
    return _Outcome(Phase.STARTING, Reason.TRAINING_STARTING, f"Job {name} is starting its pod")


def _rayjob_outcome(rayjob: Object, spec: TrainingRunSpec) -> _Outcome:
    status = rayjob.get("status", {}) or {}
    name = rayjob["metadata"]["name"]
    deployment = status.get("jobDeploymentStatus", "")
    job_status = status.get("jobStatus", "")
    start, end = status.get("startTime"), status.get("endTime")
    detail = status.get("message") or status.get("reason") or f"jobStatus {job_status or 'unset'}"
    if deployment == "Complete" and job_status == "SUCCEEDED":
        return _Outcome(
            Phase.SUCCEEDED, Reason.TRAINING_SUCCEEDED, f"RayJob {name} succeeded", start, end
        )
    if deployment in ("Failed", "ValidationFailed") or (
        deployment == "Complete" and job_status in ("FAILED", "STOPPED")
    ):
        return _Outcome(
            Phase.FAILED,
            reason_word(status.get("reason"), Reason.TRAINING_FAILED),
            f"RayJob {name} failed: {detail}",
            start,
            end,
        )
    if render.child_suspended(rayjob) or deployment in ("Suspended", "Suspending"):
        return _suspended(spec, f"RayJob {name}")
    if deployment == "Running":
        return _Outcome(Phase.RUNNING, Reason.TRAINING_RUNNING, f"RayJob {name} is running", start)
    return _Outcome(
        Phase.STARTING,
        Reason.TRAINING_STARTING,
        f"RayJob {name} is starting ({deployment or 'no status yet'})",
    )


def _suspended(spec: TrainingRunSpec, what: str) -> _Outcome:
    if spec.suspend:
        return _Outcome(Phase.SUSPENDED, Reason.SUSPENDED, f"{what} is suspended (spec.suspend)")
    if spec.queue_name is None:
        return _Outcome(Phase.STARTING, "Resuming", f"{what} is being resumed")
    return _Outcome(
        Phase.QUEUED,
        Reason.WAITING_FOR_ADMISSION,
        f"{what} waits for Kueue to admit it from queue {spec.queue_name}",
    )


def _preflight_outcome(
    job: Object, message: str | None
) -> tuple[bool | None, str, str, PreflightStatus]:
    """(passed, reason, message, status.preflight); passed is None while the Job runs."""
    name = job["metadata"]["name"]
    summary, text = parse_summary(message)
    # The condition says it in one line; status.preflight keeps all of it.
    shown = preflight_line(summary) if summary is not None else one_line(text)
    if _true(job, "Complete") is not None:
        result = PreflightStatus(job_name=name, passed=True, summary=summary, message=text)
        return True, Reason.PREFLIGHT_SUCCEEDED, shown or f"Job {name} completed", result
    if (failed := _true(job, "Failed")) is not None:
        why = shown or failed.get("message") or failed.get("reason") or "no output"
        result = PreflightStatus(job_name=name, passed=False, summary=summary, message=text)
        return False, Reason.PREFLIGHT_FAILED, f"preflight Job {name} failed: {why}", result
    running = PreflightStatus(job_name=name)
    return None, Reason.PREFLIGHT_RUNNING, f"preflight Job {name} is running", running


class _Writer:
    """Builds the next status from the previous one, one condition at a time."""

    def __init__(self, previous: TrainingRunStatus, generation: int, now: str) -> None:
        self.previous = previous
        self.status = previous.model_copy(update={"observed_generation": generation})
        self.generation = generation
        self.now = now

    def condition(self, type_: str, status: ConditionStatus, reason: str, message: str) -> None:
        conditions: list[Condition] = set_condition(
            list(self.status.conditions),
            type=type_,
            status=status,
            reason=reason,
            message=message,
            generation=self.generation,
            now=self.now,
        )
        self.status = self.status.model_copy(update={"conditions": conditions})

    def update(self, **fields: Any) -> None:
        self.status = self.status.model_copy(update=fields)

    def phase(self, outcome: _Outcome) -> None:
        for type_, phases in _PHASE_CONDITIONS:
            if outcome.phase in phases:
                self.condition(type_, TRUE, outcome.reason, outcome.message)
            else:
                self.condition(type_, FALSE, outcome.phase.value, outcome.message)
        fields: dict[str, Any] = {"phase": outcome.phase}
        if outcome.start_time and not self.status.start_time:
            fields["start_time"] = outcome.start_time
        elif outcome.phase == Phase.RUNNING and not self.status.start_time:
            fields["start_time"] = self.now
        if outcome.phase in (Phase.SUCCEEDED, Phase.FAILED) and not self.status.completion_time:
            fields["completion_time"] = outcome.completion_time or self.now
        self.update(**fields)

    def events(self, outcome: _Outcome) -> list[Event]:
        """One Event per transition: the phase, and the pool or preflight flipping mid-run."""
        found: list[Event] = []
        for type_ in (ENV_POOL_READY, PREFLIGHT_PASSED):
            before = find_condition(self.previous.conditions, type_)
            after = find_condition(self.status.conditions, type_)
            if (
                after is not None
                and after.status != UNKNOWN
                and (
                    before is None or (before.status, before.reason) != (after.status, after.reason)
                )
            ):
                warn = after.status == FALSE
                found.append(Event("Warning" if warn else "Normal", after.reason, after.message))
        if outcome.phase != self.previous.phase:
            warn = outcome.phase == Phase.FAILED
            phase_event = Event("Warning" if warn else "Normal", outcome.reason, outcome.message)
            # The phase often moves for the very reason a condition flipped: say it once.
            found = [e for e in found if e.reason != phase_event.reason]
            found.append(phase_event)
        return found


def _ttl_wake(spec: TrainingRunSpec, status: TrainingRunStatus, now: datetime.datetime) -> float:
    """Seconds until the finished run is due for deletion (0 or less: due now)."""
    assert spec.ttl_seconds_after_finished is not None
    finished = status.completion_time or now_rfc3339(now)
    ended = parse_rfc3339(finished)
    due = ended + datetime.timedelta(seconds=spec.ttl_seconds_after_finished)
    return (due - now).total_seconds()


def _finish(plan: Plan, spec: TrainingRunSpec, now: datetime.datetime) -> Plan:
    if is_finished(plan.status) and spec.ttl_seconds_after_finished is not None:
        remaining = _ttl_wake(spec, plan.status, now)
        plan.delete_run = remaining <= 0
        plan.wake_after = None if plan.delete_run else remaining
    return plan


def plan(
    run: Run,
    spec: TrainingRunSpec,
    previous: TrainingRunStatus,
    observed: Observed,
    now: datetime.datetime,
) -> Plan:
    """Everything the operator does for one TrainingRun in one reconcile."""
    writer = _Writer(previous, run.generation, now_rfc3339(now))

    if is_finished(previous):
        # A finished run is a record: its children are never made again.
        return _finish(Plan(status=writer.status), spec, now)

    def done(outcome: _Outcome, create: list[Object] | None = None) -> Plan:
        writer.phase(outcome)
        result = Plan(status=writer.status, create=create or [], events=writer.events(outcome))
        return _finish(result, spec, now)

    if spec.nodes > 1 and observed.training is None and observed.rayjob_served is False:
        return done(
            _Outcome(
                Phase.FAILED,
                Reason.RAYJOB_CRD_MISSING,
                f"nodes={spec.nodes} renders a KubeRay RayJob (ray.io/v1), which this cluster "
                "does not serve: install the KubeRay operator, or use nodes: 1",
            )
        )

    if observed.training is None and observed.override_problem is not None:
        # Refused before the pool, the preflight and any GPU: no waiting makes it compose.
        return done(
            _Outcome(Phase.FAILED, Reason.INVALID_OVERRIDE, observed.override_problem.message)
        )

    pool_name = spec.env_pool_ref.name
    ready, reason, message = pool_state(observed.pool, pool_name)
    writer.condition(ENV_POOL_READY, TRUE if ready else FALSE, reason, message)

    if observed.training is not None:
        return _follow_child(spec, observed, writer, now)

    if not ready:
        waited = None if spec.suspend else pool_wait_over(spec, writer.status, now)
        if waited is not None:
            return done(
                _Outcome(
                    Phase.FAILED,
                    Reason.ENV_POOL_TIMEOUT,
                    f"waited {int(waited)}s (envPoolTimeoutSeconds: "
                    f"{spec.env_pool_timeout_seconds}) for its pool; last seen: {message}",
                )
            )
        return done(_Outcome(Phase.WAITING_FOR_ENV_POOL, reason, message))
    if spec.suspend:
        return done(
            _Outcome(Phase.SUSPENDED, Reason.SUSPENDED, "the run is suspended (spec.suspend)")
        )

    assert observed.pool is not None
    target = RunTarget(
        run=run,
        spec=spec,
        pool_url=observed.pool["status"]["url"],
        env=observed.pool.get("spec", {}).get("env", ""),
    )
    writer.update(env_pool_url=target.pool_url)

    passed_before = find_condition(previous.conditions, PREFLIGHT_PASSED)
    if not spec.preflight.enabled:
        writer.condition(
            PREFLIGHT_PASSED, TRUE, Reason.PREFLIGHT_DISABLED, "spec.preflight.enabled is false"
        )
    elif passed_before is None or passed_before.status != TRUE:
        if observed.preflight_job is None:
            job = render.preflight_job(target)
            name = job["metadata"]["name"]
            writer.condition(
                PREFLIGHT_PASSED, UNKNOWN, Reason.PREFLIGHT_RUNNING, f"created Job {name}"
            )
            writer.update(preflight=PreflightStatus(job_name=name))
            outcome = _Outcome(
                Phase.PREFLIGHT,
                Reason.PREFLIGHT_STARTED,
                f"playing {spec.preflight.episodes} {spec.preflight.policy} episodes "
                f"through {target.pool_url} (Job {name})",
            )
            # The ConfigMap first: a preflight with the run's own templates reads them from it.
            return done(outcome, [render.config_map(target), job])
        passed, why, detail, result = _preflight_outcome(
            observed.preflight_job, observed.preflight_message
        )
        writer.update(preflight=result)
        if passed is None:
            writer.condition(PREFLIGHT_PASSED, UNKNOWN, why, detail)
            return done(_Outcome(Phase.PREFLIGHT, why, detail))
        writer.condition(PREFLIGHT_PASSED, TRUE if passed else FALSE, why, detail)
        if not passed:
            return done(_Outcome(Phase.FAILED, why, detail))

    child = render.training_child(target)
    api_version, kind = child["apiVersion"], child["kind"]
    child_name = child["metadata"]["name"]
    writer.update(training=ChildRef(api_version=api_version, kind=kind, name=child_name))
    created = _Outcome(
        Phase.QUEUED if spec.queue_name else Phase.STARTING,
        Reason.WAITING_FOR_ADMISSION if spec.queue_name else Reason.TRAINING_CREATED,
        f"created {kind} {child_name}: {device.describe(spec)}, "
        f"{spec.algorithm} on {spec.model.path}"
        + (f", queued in {spec.queue_name}" if spec.queue_name else ""),
    )
    return done(created, [render.config_map(target), child])


def _follow_child(
    spec: TrainingRunSpec, observed: Observed, writer: _Writer, now: datetime.datetime
) -> Plan:
    """The training child exists: mirror it and its trainer's progress, and hand it spec.suspend."""
    child = observed.training
    assert child is not None
    if child["kind"] == "Job":
        outcome = _job_outcome(child, spec, observed.trainer_pod)
    else:
        outcome = _rayjob_outcome(child, spec)
    writer.update(
        training=ChildRef(
            api_version=child["apiVersion"], kind=child["kind"], name=child["metadata"]["name"]
        ),
        progress=newer_progress(writer.status.progress, parse_progress(observed.trainer_log)),
    )
    writer.phase(outcome)
    suspend: bool | None = None
    finished = outcome.phase in (Phase.SUCCEEDED, Phase.FAILED)
    if not finished and spec.suspend and not render.child_suspended(child):
        suspend = True
    elif not finished and not spec.suspend and render.child_suspended(child):
        # A queued child is Kueue's to unsuspend once admitted.
        suspend = None if spec.queue_name else False
    result = Plan(status=writer.status, suspend_child=suspend, events=writer.events(outcome))
    return _finish(result, spec, now)


def rejected(
    planned: TrainingRunStatus, obj: Object, error: str, generation: int, now: datetime.datetime
) -> Plan:
    """The API server refused a child the plan created: the run fails and says why."""
    writer = _Writer(planned, generation, now_rfc3339(now))
    writer.update(training=None)
    what = f"{obj['kind']} {obj['metadata']['name']}"
    outcome = _Outcome(
        Phase.FAILED, Reason.CHILD_REJECTED, f"the API server rejected {what}: {error}"
    )
    writer.phase(outcome)
    return Plan(status=writer.status, events=writer.events(outcome))
