"""The TrainingRun life as one pure function: what exists in, what to create and the status out.

Level-based: every call looks at the pool, the preflight Job and the training child as they are
now, so a restarted operator or a missed event changes nothing.
"""

import dataclasses
import datetime
from collections.abc import Mapping
from typing import Any

from gymkube_operator import runs
from gymkube_operator.conditions import (
    Condition,
    ConditionStatus,
    cut,
    find_condition,
    now_rfc3339,
    one_line,
    set_condition,
)
from gymkube_operator.envpool.pods import pod_trouble
from gymkube_operator.envpool.reasons import Degraded
from gymkube_operator.objects import Object
from gymkube_operator.runs import Event
from gymkube_operator.trainingrun import admission, demand, device, history, render, restarts
from gymkube_operator.trainingrun.command import Run, RunTarget, ServedPool
from gymkube_operator.trainingrun.models import (
    ChildRef,
    Phase,
    PreflightStatus,
    RunDemand,
    TrainerRestart,
    TrainerRestarts,
    TrainingHistory,
    TrainingRunSpec,
    TrainingRunStatus,
)
from gymkube_operator.trainingrun.overrides import OverrideProblem
from gymkube_operator.trainingrun.readings import (
    newer_progress,
    parse_progress,
    parse_summary,
    pool_wait_over,
    pools_state,
    preflight_line,
    progress_lines,
    reason_word,
    trainer_exited_cleanly,
    trainer_failure,
    trainer_verdict,
    true_condition,
)
from gymkube_operator.trainingrun.reasons import ConditionType, Reason

ENV_POOL_READY = ConditionType.ENV_POOL_READY
ENV_POOL_SIZED = ConditionType.ENV_POOL_SIZED
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


@dataclasses.dataclass(frozen=True)
class Observed:
    """What exists right now."""

    # The run's first pool (its only one, but with envPools), then envPools' others in order.
    pool: Object | None
    more_pools: tuple[Object | None, ...] = ()
    preflight_job: Object | None = None
    # The preflight containers' termination messages (a JSON summary, or a log tail), by name.
    preflight_messages: Mapping[str, str] = dataclasses.field(default_factory=dict)
    training: Object | None = None
    # The pod the training Job runs its trainer in (restarts.trainer_pods), the Job's other pods
    # (newest first), and the tail of the trainer container's log once it started.
    trainer_pod: Object | None = None
    earlier_trainer_pods: tuple[Object, ...] = ()
    trainer_log: str | None = None
    # The log of the pod status.history recorded last, once the Job has replaced it (while the pod
    # is still there): the steps it printed after the last read.
    earlier_trainer_log: str | None = None
    # Whether the API server serves ray.io/v1 RayJob; None when nobody asked (nodes = 1).
    rayjob_served: bool | None = None
    # What Kueue says of a child it holds suspended; None when the run names no queue or runs.
    queued: admission.Admission | None = None
    # What verl's config says of spec.overrides; None when they compose (or nobody asked).
    override_problem: OverrideProblem | None = None
    # Whether customAgentLoop.configMap exists; None when nobody asked.
    custom_loop_code_found: bool | None = None
    # The sessions the run keeps open at once (demand.of_config); None without verl's config.
    demand: RunDemand | None = None


@dataclasses.dataclass
class Plan:
    status: TrainingRunStatus
    create: list[Object] = dataclasses.field(default_factory=list)
    # Set the training child's spec.suspend to this.
    suspend_child: bool | None = None
    # Its TTL after finishing is over: delete it.
    delete_expired: bool = False
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
    # A cause the user must act on while the phase stays: a Warning Event when it first shows.
    trouble: bool = False


def reads_progress(status: TrainingRunStatus) -> bool:
    """Whether the run's trainer is running, so that its log has new progress to read."""
    return status.phase == Phase.RUNNING and status.training is not None


def is_finished(status: TrainingRunStatus) -> bool:
    return runs.is_finished(status.conditions)


# What keeps a trainer pod from starting (envpool.pods.pod_trouble's readings); how a started
# trainer ended is the Job's and restarts' to tell.
_CANNOT_START = frozenset(
    {Degraded.UNSCHEDULABLE, Degraded.IMAGE_PULL_FAILED, Degraded.CONTAINER_CREATE_FAILED}
)


def _job_outcome(
    job: Object, spec: TrainingRunSpec, pod: Object | None, queued: admission.Admission | None
) -> _Outcome:
    status = job.get("status", {}) or {}
    name = job["metadata"]["name"]
    start = status.get("startTime")
    if (done := true_condition(job, "Complete")) is not None:
        return _Outcome(
            Phase.SUCCEEDED,
            Reason.TRAINING_SUCCEEDED,
            f"Job {name} completed",
            start,
            status.get("completionTime") or done.get("lastTransitionTime"),
        )
    if (failed := true_condition(job, "Failed")) is not None:
        reason, message = trainer_failure(job, failed, pod)
        return _Outcome(Phase.FAILED, reason, message, start, failed.get("lastTransitionTime"))
    if render.child_suspended(job) or true_condition(job, "Suspended") is not None:
        return _suspended(spec, f"Job {name}", queued)
    # `active` counts pending pods too; a trainer is running once its pod is ready. A trainer that
    # exited 0 stays Running until the Job controller marks the Job Complete, not Starting again:
    # its pod says so first, then the Job's counts and conditions.
    if status.get("ready", 0) > 0:
        return _Outcome(Phase.RUNNING, Reason.TRAINING_RUNNING, f"Job {name} is running", start)
    if (
        trainer_exited_cleanly(pod)
        or status.get("succeeded", 0) > 0
        or true_condition(job, "SuccessCriteriaMet") is not None
    ):
        message = f"Job {name}'s trainer finished; the Job is completing"
        return _Outcome(Phase.RUNNING, Reason.TRAINING_RUNNING, message, start)
    trouble = None if pod is None else pod_trouble(pod)
    if trouble is not None and trouble.reason in _CANNOT_START:
        # Still Starting (a node may be added, a Secret created), but with the cause in view.
        message = f"Job {name}'s trainer pod {trouble.pod} cannot start: {trouble.detail}"
        return _Outcome(Phase.STARTING, trouble.reason, message, trouble=True)
    return _Outcome(Phase.STARTING, Reason.TRAINING_STARTING, f"Job {name} is starting its pod")


def _first_line(text: str | None) -> str | None:
    return one_line((text or "").strip().split("\n", 1)[0]) if text else None


def _rayjob_outcome(
    rayjob: Object, spec: TrainingRunSpec, queued: admission.Admission | None, log: str | None
) -> _Outcome:
    status = rayjob.get("status", {}) or {}
    name = rayjob["metadata"]["name"]
    deployment = status.get("jobDeploymentStatus", "")
    job_status = status.get("jobStatus", "")
    start, end = status.get("startTime"), status.get("endTime")
    # KubeRay's message on a failed job carries the head's whole log tail: gymkube-train's own
    # line says why in one, when the trainer got that far.
    detail = (
        trainer_verdict(log)
        or _first_line(status.get("message"))
        or status.get("reason")
        or f"jobStatus {job_status or 'unset'}"
    )
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
        return _suspended(spec, f"RayJob {name}", queued)
    if deployment == "Running":
        return _Outcome(Phase.RUNNING, Reason.TRAINING_RUNNING, f"RayJob {name} is running", start)
    return _Outcome(
        Phase.STARTING,
        Reason.TRAINING_STARTING,
        f"RayJob {name} is starting ({deployment or 'no status yet'})",
    )


def _suspended(spec: TrainingRunSpec, what: str, queued: admission.Admission | None) -> _Outcome:
    if spec.suspend:
        return _Outcome(Phase.SUSPENDED, Reason.SUSPENDED, f"{what} is suspended (spec.suspend)")
    if spec.queue_name is None:
        return _Outcome(Phase.STARTING, "Resuming", f"{what} is being resumed")
    reason, message = admission.waiting(queued or admission.Admission(), spec.queue_name, what)
    return _Outcome(Phase.QUEUED, reason, message)


def _pool_preflights(
    target: RunTarget, messages: Mapping[str, str]
) -> tuple[dict[str, Any] | None, str | None, str]:
    """(summary, other text, one line) of the preflight's containers: the one container's as
    is; with envPools, {pool: summary} and the lines of the pools that did not pass (all, when
    every one did), each named."""
    if not target.pools:
        summary, text = parse_summary(messages.get(render.preflight_container(None)))
        return (
            summary,
            text,
            preflight_line(summary) if summary is not None else one_line(text) or "",
        )
    summaries: dict[str, Any] = {}
    lines: list[tuple[bool, str]] = []
    for pool in target.pools:
        summary, text = parse_summary(messages.get(render.preflight_container(pool.name)))
        summaries[pool.name] = summary if summary is not None else text
        said = preflight_line(summary) if summary is not None else one_line(text)
        passed = summary is not None and summary.get("ok") is not False
        lines.append((passed, f"EnvPool {pool.name}: {said or 'no summary'}"))
    failing = [line for passed, line in lines if not passed]
    return {"pools": summaries}, None, cut("; ".join(failing or [line for _, line in lines]))


def _preflight_outcome(
    job: Object, target: RunTarget, messages: Mapping[str, str]
) -> tuple[bool | None, str, str, PreflightStatus]:
    """(passed, reason, message, status.preflight); passed is None while the Job runs."""
    name = job["metadata"]["name"]
    # The condition says it in one line; status.preflight keeps all of it.
    summary, text, shown = _pool_preflights(target, messages)
    if true_condition(job, "Complete") is not None:
        result = PreflightStatus(job_name=name, passed=True, summary=summary, message=text)
        return True, Reason.PREFLIGHT_SUCCEEDED, shown or f"Job {name} completed", result
    if (failed := true_condition(job, "Failed")) is not None:
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

    def _previous_messages(self) -> set[str]:
        return {c.message for c in self.previous.conditions}

    def events(self, outcome: _Outcome) -> list[Event]:
        """One Event per transition: the phase, and the pool or preflight flipping mid-run."""
        found: list[Event] = []
        for type_ in (ENV_POOL_READY, ENV_POOL_SIZED, PREFLIGHT_PASSED):
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
        if outcome.phase != self.previous.phase or (
            outcome.trouble and outcome.message not in self._previous_messages()
        ):
            warn = outcome.phase == Phase.FAILED or outcome.trouble
            phase_event = Event("Warning" if warn else "Normal", outcome.reason, outcome.message)
            # The phase often moves for the very reason a condition flipped: say it once.
            found = [e for e in found if e.reason != phase_event.reason]
            found.append(phase_event)
        return found


def _finish(plan: Plan, spec: TrainingRunSpec, now: datetime.datetime) -> Plan:
    ttl = spec.ttl_seconds_after_finished
    if is_finished(plan.status) and ttl is not None:
        remaining = runs.ttl_remaining(ttl, plan.status.completion_time or now_rfc3339(now), now)
        plan.delete_expired = remaining <= 0
        plan.wake_after = None if plan.delete_expired else remaining
    return plan


def _target(run: Run, spec: TrainingRunSpec, ready_pools: dict[str, Object | None]) -> RunTarget:
    """The run and the pools it plays, every one of them Ready."""
    served = []
    for share in spec.pools():
        pool = ready_pools[share.name]
        assert pool is not None, "pools_state said every pool is Ready"
        served.append(
            ServedPool(share, pool["status"]["url"], (pool.get("spec") or {}).get("env", ""))
        )
    first = served[0]
    mixed = tuple(served) if spec.env_pools is not None else ()
    return RunTarget(run=run, spec=spec, pool_url=first.url, env=first.env, pools=mixed)


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

    found = dict(
        zip([p.name for p in spec.pools()], (observed.pool, *observed.more_pools), strict=True)
    )
    ready, reason, message = pools_state(found)
    writer.condition(ENV_POOL_READY, TRUE if ready else FALSE, reason, message)
    if observed.demand is not None:
        # Advisory: a pool smaller than the run's demand slows its steps, it does not fail them.
        writer.update(demand=observed.demand)
        sized, line = demand.sizing(observed.demand, found)
        writer.condition(
            ENV_POOL_SIZED,
            TRUE if sized else FALSE,
            Reason.CAPACITY_MEETS_DEMAND if sized else Reason.CAPACITY_BELOW_DEMAND,
            line,
        )

    if observed.training is not None:
        return _follow_child(spec, observed, writer, now)

    if not ready:
        waited = (
            None
            if spec.suspend
            else pool_wait_over(writer.status.conditions, spec.env_pool_timeout_seconds, now)
        )
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

    target = _target(run, spec, found)
    writer.update(
        env_pool_url=target.pool_url,
        env_pool_urls={p.name: p.url for p in target.pools} or None,
    )

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
                f"through {', '.join(p.url for p in target.pools) or target.pool_url} "
                f"(Job {name}{', on each pool' if target.pools else ''})",
            )
            # The ConfigMap first: a preflight with the run's own templates reads them from it.
            return done(outcome, [render.config_map(target), job])
        passed, why, detail, result = _preflight_outcome(
            observed.preflight_job, target, observed.preflight_messages
        )
        writer.update(preflight=result)
        if passed is None:
            writer.condition(PREFLIGHT_PASSED, UNKNOWN, why, detail)
            return done(_Outcome(Phase.PREFLIGHT, why, detail))
        writer.condition(PREFLIGHT_PASSED, TRUE if passed else FALSE, why, detail)
        if not passed:
            return done(_Outcome(Phase.FAILED, why, detail))

    custom = spec.custom_agent_loop
    if custom is not None and custom.config_map and observed.custom_loop_code_found is False:
        # A pod would wait on the mount too, with the cause only in its Events; say it here.
        return done(
            _Outcome(
                Phase.PENDING,
                Reason.AGENT_LOOP_CODE_NOT_FOUND,
                f"ConfigMap {custom.config_map} (customAgentLoop.configMap) is not in namespace "
                f"{run.namespace}: create it from your loop's files (kubectl create configmap "
                f"{custom.config_map} --from-file=...); the trainer starts once it exists",
                trouble=True,
            )
        )

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


def _job_ending(job: Object, outcome: _Outcome) -> bool:
    """Whether the Job has ended or is ending (it stops its pods before its terminal condition)."""
    return outcome.phase in (Phase.SUCCEEDED, Phase.FAILED) or any(
        true_condition(job, type_) is not None for type_ in ("FailureTarget", "SuccessCriteriaMet")
    )


def _follow_trainer(job: Object, observed: Observed, writer: _Writer) -> TrainerRestart | None:
    """Follow the pod the Job runs the trainer in; record a restart when one ended (returned)."""
    pods = [p for p in (observed.trainer_pod, *observed.earlier_trainer_pods) if p is not None]
    suspended = render.child_suspended(job) or true_condition(job, "Suspended") is not None
    pod, after, found = restarts.follow(
        writer.status.restarts or TrainerRestarts(),
        writer.status.trainer_pod,
        pods,
        parse_progress(observed.trainer_log),
        suspended=suspended,
        now=writer.now,
    )
    writer.update(trainer_pod=pod, restarts=after)
    return found


def _history(recorded: TrainingHistory | None, observed: Observed) -> TrainingHistory | None:
    """status.history with the steps of the logs read: the replaced pod's, then the trainer's."""
    if observed.earlier_trainer_log is not None and recorded is not None and recorded.pod:
        lines = progress_lines(observed.earlier_trainer_log)
        recorded = history.recorded(recorded, recorded.pod, lines)
    if observed.trainer_pod is not None:
        pod = restarts.pod_name(observed.trainer_pod)
        recorded = history.recorded(recorded, pod, progress_lines(observed.trainer_log))
    return recorded


def _restarting(
    outcome: _Outcome, previous: Phase, job: Object, status: TrainingRunStatus
) -> _Outcome:
    """A trainer that ran and whose pod is being replaced keeps the run Running: a restart is not a
    failure, and the retry resumes from the newest checkpoint."""
    if outcome.phase != Phase.STARTING or previous != Phase.RUNNING:
        return outcome
    message = f"Job {job['metadata']['name']} restarts its trainer"
    recent = status.restarts.recent if status.restarts else []
    if recent and recent[-1].resumed_from_step is None:
        message += f": {recent[-1].message}"
    return _Outcome(Phase.RUNNING, Reason.TRAINER_RESTARTING, message, outcome.start_time)


def _restart_event(restart: TrainerRestart) -> str:
    if restart.reason == Reason.SUSPENDED:
        return f"{restart.message}; the trainer resumes from its newest checkpoint with the Job"
    return f"{restart.message}; the Job starts another, which resumes from the newest checkpoint"


def _follow_child(
    spec: TrainingRunSpec, observed: Observed, writer: _Writer, now: datetime.datetime
) -> Plan:
    """The training child exists: mirror it, its trainer's progress and restarts, and hand it
    spec.suspend."""
    child = observed.training
    assert child is not None
    if child["kind"] == "Job":
        outcome = _job_outcome(child, spec, observed.trainer_pod, observed.queued)
    else:
        outcome = _rayjob_outcome(child, spec, observed.queued, observed.trainer_log)
    writer.update(
        training=ChildRef(
            api_version=child["apiVersion"], kind=child["kind"], name=child["metadata"]["name"]
        ),
        progress=newer_progress(writer.status.progress, parse_progress(observed.trainer_log)),
        history=_history(writer.status.history, observed),
    )
    restarted = None
    if child["kind"] == "Job" and not _job_ending(child, outcome):
        restarted = _follow_trainer(child, observed, writer)
        outcome = _restarting(outcome, writer.previous.phase, child, writer.status)
    writer.phase(outcome)
    suspend: bool | None = None
    finished = outcome.phase in (Phase.SUCCEEDED, Phase.FAILED)
    if not finished and spec.suspend and not render.child_suspended(child):
        suspend = True
    elif not finished and not spec.suspend and render.child_suspended(child):
        # A queued child is Kueue's to unsuspend once admitted.
        suspend = None if spec.queue_name else False
    events = writer.events(outcome)
    if restarted is not None:
        events.append(Event("Warning", restarted.reason, _restart_event(restarted)))
    result = Plan(status=writer.status, suspend_child=suspend, events=events)
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
