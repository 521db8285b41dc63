"""The EvalRun life as one pure function: what exists in, what to create and the status out.

Level-based: every call looks at the pool, the model's TrainingRun and the eval Job as they are
now, so a restarted operator or a missed event changes nothing.
"""

import dataclasses
import datetime
from typing import Any

from gymkube_operator import runs
from gymkube_operator.conditions import (
    ConditionStatus,
    now_rfc3339,
    set_condition,
)
from gymkube_operator.evalrun import readings, render
from gymkube_operator.evalrun.command import EvalTarget, described_model
from gymkube_operator.evalrun.models import (
    EvalProgress,
    EvalResult,
    EvalRunSpec,
    EvalRunStatus,
    Phase,
)
from gymkube_operator.evalrun.reasons import ConditionType, Reason
from gymkube_operator.objects import Object
from gymkube_operator.runs import Event
from gymkube_operator.trainingrun import command as training
from gymkube_operator.trainingrun.command import Run
from gymkube_operator.trainingrun.models import TrainingRunSpec
from gymkube_operator.trainingrun.readings import pool_state, pool_wait_over, true_condition
from gymkube_operator.trainingrun.reasons import Reason as TrainingRunReason

TRUE, FALSE = ConditionStatus.TRUE, ConditionStatus.FALSE

# Which phase each phase-derived condition is True in; False, its reason is the phase.
_PHASE_CONDITIONS = (
    (ConditionType.RUNNING, Phase.RUNNING),
    (ConditionType.SUCCEEDED, Phase.SUCCEEDED),
    (ConditionType.FAILED, Phase.FAILED),
)
_FINISHED = (Phase.SUCCEEDED, Phase.FAILED)


@dataclasses.dataclass(frozen=True)
class Observed:
    """What exists right now."""

    pool: Object | None
    # The TrainingRun the model names, read until the Job exists (None: none named, or missing).
    training_run: Object | None = None
    job: Object | None = None
    # The Job's newest pod, and the tail of its eval container's log once that started.
    pod: Object | None = None
    log: str | None = None


@dataclasses.dataclass
class Plan:
    status: EvalRunStatus
    create: list[Object] = dataclasses.field(default_factory=list)
    events: list[Event] = dataclasses.field(default_factory=list)
    # Its TTL after finishing is over: delete it.
    delete_expired: bool = False
    # Seconds until something is due without any event (the TTL).
    wake_after: float | None = None


@dataclasses.dataclass(frozen=True)
class _Outcome:
    phase: Phase
    reason: str
    message: str


def is_finished(status: EvalRunStatus) -> bool:
    return runs.is_finished(status.conditions)


def reads_progress(status: EvalRunStatus) -> bool:
    """Whether gymkube-eval is playing, so its log has progress lines no watch event tells of."""
    return status.phase == Phase.RUNNING


class _Writer:
    """Builds the next status from the previous one."""

    def __init__(self, previous: EvalRunStatus, generation: int, now: datetime.datetime) -> None:
        self.previous = previous
        self.status = previous.model_copy(update={"observed_generation": generation})
        self.generation = generation
        self.now = now_rfc3339(now)

    def condition(self, type_: str, status: ConditionStatus, reason: str, message: str) -> None:
        conditions = set_condition(
            list(self.status.conditions),
            type=type_,
            status=status,
            reason=reason,
            message=message,
            generation=self.generation,
            now=self.now,
        )
        self.update(conditions=conditions)

    def update(self, **fields: Any) -> None:
        self.status = self.status.model_copy(update=fields)

    def phase(self, outcome: _Outcome) -> list[Event]:
        """Set the phase and its conditions; the Event of a phase change."""
        for type_, phase in _PHASE_CONDITIONS:
            if outcome.phase == phase:
                self.condition(type_, TRUE, outcome.reason, outcome.message)
            else:
                self.condition(type_, FALSE, outcome.phase.value, outcome.message)
        self.update(phase=outcome.phase)
        if outcome.phase in _FINISHED and not self.status.completion_time:
            self.update(completion_time=self.now)
        if outcome.phase == self.previous.phase:
            return []
        warn = outcome.phase == Phase.FAILED
        return [Event("Warning" if warn else "Normal", outcome.reason, outcome.message)]


def _finish(plan: Plan, spec: EvalRunSpec, now: datetime.datetime) -> Plan:
    """The TTL of a finished eval: due now, or in how many seconds."""
    ttl = spec.ttl_seconds_after_finished
    if ttl is None or not is_finished(plan.status):
        return plan
    remaining = runs.ttl_remaining(ttl, plan.status.completion_time or now_rfc3339(now), now)
    plan.delete_expired = remaining <= 0
    plan.wake_after = None if plan.delete_expired else remaining
    return plan


def _checkpoint_problem(spec: EvalRunSpec, training_run: TrainingRunSpec | None) -> _Outcome | None:
    """Why a trainingRun model cannot be scored, before anything is created."""
    checkpoint = spec.model.training_run
    if checkpoint is None:
        return None
    if training_run is None:
        return _Outcome(
            Phase.FAILED,
            Reason.TRAINING_RUN_NOT_FOUND,
            f"TrainingRun {checkpoint.name} does not exist in this namespace: its checkpoints "
            "cannot be found without its spec.checkpoints volume",
        )
    if not training.keeps_checkpoints(training_run):
        return _Outcome(
            Phase.FAILED,
            Reason.NO_CHECKPOINTS_VOLUME,
            f"TrainingRun {checkpoint.name} has no spec.checkpoints volume: its checkpoints were "
            "in an emptyDir and died with its pod; train it with a checkpoints PVC to score them",
        )
    return None


def plan(
    run: Run,
    spec: EvalRunSpec,
    previous: EvalRunStatus,
    observed: Observed,
    now: datetime.datetime,
) -> Plan:
    """Everything the operator does for one EvalRun in one reconcile."""
    writer = _Writer(previous, run.generation, now)
    if is_finished(previous):
        # A finished eval is a record: its Job is never made again.
        return _finish(Plan(status=writer.status), spec, now)
    model = described_model(spec)
    writer.update(model=model)

    def done(outcome: _Outcome, create: list[Object] | None = None) -> Plan:
        events = writer.phase(outcome)
        return _finish(Plan(status=writer.status, create=create or [], events=events), spec, now)

    pool_name = spec.env_pool_ref.name
    ready, reason, message = pool_state(observed.pool, pool_name)
    if observed.job is not None:
        writer.condition(ConditionType.ENV_POOL_READY, TRUE if ready else FALSE, reason, message)
        return done(*_follow_job(run, spec, observed, writer))
    training_run = None
    if observed.training_run is not None:
        training_run = TrainingRunSpec.model_validate(observed.training_run["spec"])
    if (problem := _checkpoint_problem(spec, training_run)) is not None:
        return done(problem)
    writer.condition(ConditionType.ENV_POOL_READY, TRUE if ready else FALSE, reason, message)
    if not ready:
        if pool_wait_over(writer.status.conditions, spec.env_pool_timeout_seconds, now):
            return done(
                _Outcome(
                    Phase.FAILED,
                    TrainingRunReason.ENV_POOL_TIMEOUT,
                    f"waited {spec.env_pool_timeout_seconds}s (envPoolTimeoutSeconds) for its "
                    f"pool; last seen: {message}",
                )
            )
        return done(_Outcome(Phase.WAITING_FOR_ENV_POOL, reason, message))

    assert observed.pool is not None
    target = EvalTarget(
        run=run,
        spec=spec,
        pool_url=observed.pool["status"]["url"],
        env=(observed.pool.get("spec") or {}).get("env", ""),
        training_run=training_run,
    )
    job = render.eval_job(target)
    name = job["metadata"]["name"]
    writer.update(env_pool_url=target.pool_url, job=name)
    created = _Outcome(
        Phase.STARTING,
        Reason.EVAL_CREATED,
        f"created Job {name}: {spec.dataset.size} {spec.dataset.split} tasks x "
        f"{spec.sampling.samples_per_task} of {model} on {target.device} "
        f"through {target.pool_url}",
    )
    return done(created, [render.config_map(target), job])


def _result_line(result: EvalResult) -> str:
    lo, hi = result.mean_score_interval
    return (
        f"mean score {result.mean_score:.3f} (95% {lo:.3f} to {hi:.3f}), {result.successes}/"
        f"{result.episodes} episodes succeeded, {result.env_errors} env errors, on {result.model}"
    )


def _succeeded(
    run: Run, spec: EvalRunSpec, observed: Observed, writer: _Writer, job: str
) -> tuple[_Outcome, list[Object]]:
    """The completed Job's result: the summary line of its log (whose per-task results go to the
    results ConfigMap), else its termination message."""
    summary = readings.summary(observed.log)
    result: EvalResult | None = summary
    if result is None:
        result = readings.termination_result(observed.pod, render.EVAL)
    if result is None:
        message = (
            f"Job {job} completed but gymkube-eval left no summary (no "
            f"{readings.RESULT_PREFIX.strip()} line, no termination message)"
        )
        return _Outcome(Phase.FAILED, Reason.NO_RESULT, message), []
    total = writer.status.progress.total if writer.status.progress else 0
    writer.update(
        result=EvalResult.model_validate(result.model_dump(include=set(EvalResult.model_fields))),
        progress=EvalProgress(
            episodes=result.episodes,
            total=max(total, result.episodes),
            successes=result.successes,
            mean_score=result.mean_score,
        ),
    )
    if summary is None:
        return _Outcome(Phase.SUCCEEDED, Reason.EVAL_SUCCEEDED, _result_line(result)), []
    results = render.results_config_map(run, spec, summary)
    writer.update(results_config_map=results["metadata"]["name"])
    return _Outcome(Phase.SUCCEEDED, Reason.EVAL_SUCCEEDED, _result_line(result)), [results]


def _follow_job(
    run: Run, spec: EvalRunSpec, observed: Observed, writer: _Writer
) -> tuple[_Outcome, list[Object]]:
    """The eval Job exists: mirror it and gymkube-eval's progress; on success, its result."""
    job = observed.job
    assert job is not None
    name = job["metadata"]["name"]
    status = job.get("status") or {}
    if status.get("startTime") and not writer.status.start_time:
        writer.update(start_time=status["startTime"])
    if (found := readings.progress(observed.log)) is not None:
        writer.update(progress=found)
    if true_condition(job, "Complete") is not None:
        return _succeeded(run, spec, observed, writer, name)
    if (failed := true_condition(job, "Failed")) is not None:
        reason, message = readings.eval_failure(
            job, failed, observed.pod, render.EVAL, render.DATASET
        )
        return _Outcome(Phase.FAILED, reason, message), []
    if status.get("ready", 0) > 0 or readings.terminated(observed.pod, render.EVAL):
        return _Outcome(Phase.RUNNING, Reason.EVAL_RUNNING, f"Job {name} is playing episodes"), []
    return _Outcome(Phase.STARTING, Reason.EVAL_STARTING, f"Job {name} is starting its pod"), []


def rejected(
    planned: EvalRunStatus, obj: Object, error: str, generation: int, now: datetime.datetime
) -> Plan:
    """The API server refused a child the plan created: the eval fails and says why."""
    writer = _Writer(planned, generation, now)
    writer.update(job=None)
    what = f"{obj['kind']} {obj['metadata']['name']}"
    outcome = _Outcome(
        Phase.FAILED, TrainingRunReason.CHILD_REJECTED, f"the API server rejected {what}: {error}"
    )
    events = writer.phase(outcome)
    return Plan(status=writer.status, events=events)
