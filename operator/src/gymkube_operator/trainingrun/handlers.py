"""kopf handlers for TrainingRun: read what exists → pure plan → apply, patch, post Events.

One daemon per run does every reconcile (gymkube_operator.runs); watch events on the run, its
pool, its Jobs and its RayJob only wake that daemon.
"""

import asyncio
import dataclasses
import logging
from typing import Any

import aiohttp
import kopf

from gymkube_operator import metrics, runs
from gymkube_operator.kinds import API_VERSION, GROUP, VERSION
from gymkube_operator.kube import KubeError
from gymkube_operator.labels import RUN_LABEL
from gymkube_operator.objects import Object
from gymkube_operator.runtime import Runtime, namespaced
from gymkube_operator.settings import OperatorSettings
from gymkube_operator.trainingrun import (
    admission,
    command,
    demand,
    history,
    lifecycle,
    overrides,
    readings,
    render,
    restarts,
)
from gymkube_operator.trainingrun.models import (
    KIND,
    PLURAL,
    TrainingHistory,
    TrainingRunSpec,
    TrainingRunStatus,
)

logger = logging.getLogger(__name__)

# How much of the trainer's log a reconcile reads for its progress lines: many steps' output.
LOG_TAIL_LINES = 2000
# When that tail does not reach back to the last step recorded (an operator down for a while, a
# trainer printing fast), the longer one it reads instead: a kubelet's whole log file (10 MiB by
# default) in most cases.
LONG_LOG_TAIL_LINES = 50_000


async def _job_pods(rt: Runtime, namespace: str, job: str) -> list[Object]:
    """The Job's pods, newest first."""
    pods = await rt.client.list("v1", "Pod", namespace, f"batch.kubernetes.io/job-name={job}")
    pods.sort(key=lambda pod: pod["metadata"].get("creationTimestamp", ""), reverse=True)
    return pods


async def _termination_messages(rt: Runtime, namespace: str, job: str) -> dict[str, str]:
    """The preflight containers' termination messages, by name, from the Job's newest pod that
    has any."""
    for pod in await _job_pods(rt, namespace, job):
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        messages = {
            status["name"]: terminated["message"]
            for status in statuses
            if "message" in (terminated := (status.get("state") or {}).get("terminated") or {})
        }
        if messages:
            return messages
    return {}


@dataclasses.dataclass(frozen=True)
class _Training:
    """The training child (None while RayJob is not served), whether the API server serves
    RayJob (None when not asked), and the pods that have the trainer's log (a Job's; KubeRay's
    submitter pods for a RayJob), its tail and that of the replaced pod whose steps
    status.history recorded last, while it is still there."""

    child: Object | None = None
    rayjob_served: bool | None = None
    trainer_pod: Object | None = None
    earlier_pods: tuple[Object, ...] = ()
    trainer_log: str | None = None
    earlier_trainer_log: str | None = None
    queued: admission.Admission | None = None


async def _admission(
    rt: Runtime, namespace: str, spec: TrainingRunSpec, child: Object
) -> admission.Admission | None:
    """Kueue's Workload for a child it holds suspended, and its place in the queue; None when the
    run names no queue or its child runs. A cluster without Kueue (or its visibility API) gives
    what it can: the run still says it waits."""
    if spec.queue_name is None or not render.child_suspended(child):
        return None
    try:
        found = await rt.client.list(
            admission.KUEUE_API, "Workload", namespace, admission.workload_selector(child)
        )
    except KubeError as error:
        if error.status not in (403, 404):
            raise
        return admission.Admission()
    workload = found[0] if found else None
    position = None
    if workload is not None:
        try:
            pending = await rt.client.get_path(
                admission.pending_workloads_path(namespace, spec.queue_name)
            )
        except KubeError as error:
            if error.status not in (403, 404, 503):
                raise
        else:
            position = admission.position_in(pending, workload)
    return admission.Admission(workload, position)


async def _log_tail(rt: Runtime, namespace: str, name: str, lines: int) -> str | None:
    try:
        return await rt.client.pod_log(namespace, name, render.TRAINER, lines)
    except (KubeError, aiohttp.ClientError, TimeoutError) as error:
        logger.warning("no trainer log from pod %s/%s: %s", namespace, name, error)
        return None


async def _trainer_log(
    rt: Runtime, namespace: str, pod: Object, recorded: TrainingHistory | None
) -> str | None:
    """The tail of the trainer's log once it started, long enough to hold every step since the
    last one recorded when the kubelet still has them (None when it cannot give it now: progress
    waits for the next read)."""
    if not readings.trainer_started(pod):
        return None
    name = restarts.pod_name(pod)
    log = await _log_tail(rt, namespace, name, LOG_TAIL_LINES)
    if (
        log is not None
        and len(log.splitlines()) >= LOG_TAIL_LINES
        and not history.reaches_back(recorded, name, readings.progress_lines(log))
    ):
        log = await _log_tail(rt, namespace, name, LONG_LOG_TAIL_LINES) or log
    return log


async def _training(
    rt: Runtime, name: str, namespace: str, spec: TrainingRunSpec, status: TrainingRunStatus
) -> _Training:
    if status.training is not None:
        api_version, kind = status.training.api_version, status.training.kind
    else:
        api_version, kind = render.training_api_version(spec.nodes)
    served = await rt.client.served(render.RAYJOB_API, "rayjobs") if kind == "RayJob" else None
    if served is False:
        return _Training(rayjob_served=served)
    child_name = render.training_name(name)
    training = await rt.client.get(api_version, kind, namespace, child_name)
    if training is None:
        return _Training(training, served)
    queued = await _admission(rt, namespace, spec, training)
    # A Job's own pods; for a RayJob, those of the Job KubeRay names after it, whose submitter pod
    # follows the trainer's log on the Ray head.
    pod, earlier = restarts.trainer_pods(await _job_pods(rt, namespace, child_name))
    log = None if pod is None else await _trainer_log(rt, namespace, pod, status.history)
    # The pod whose steps were recorded last, when the Job has replaced it and it is still there:
    # the steps it printed since the last read (the next pod does not train again those up to
    # the checkpoint it resumes from).
    recorded_pod = status.history.pod if status.history is not None else None
    replaced = next((p for p in earlier if restarts.pod_name(p) == recorded_pod), None)
    earlier_log = None
    if replaced is not None:
        earlier_log = await _trainer_log(rt, namespace, replaced, status.history)
    return _Training(training, served, pod, tuple(earlier), log, earlier_log, queued)


async def _preflight(
    rt: Runtime, name: str, namespace: str
) -> tuple[Object | None, dict[str, str]]:
    """The preflight Job, and its containers' verdicts once it finished."""
    job_name = render.preflight_job_name(name)
    job = await rt.client.get("batch/v1", "Job", namespace, job_name)
    if job is None or not readings.job_finished(job):
        return job, {}
    return job, await _termination_messages(rt, namespace, job_name)


async def observe(
    rt: Runtime, name: str, namespace: str, spec: TrainingRunSpec, status: TrainingRunStatus
) -> lifecycle.Observed:
    """Read the pool and the run's children (fixed names, one GET each), and for a training Job
    its pods and its trainer's log."""
    first, *others = [
        await rt.client.get(API_VERSION, "EnvPool", namespace, pool.name) for pool in spec.pools()
    ]
    found = await _training(rt, name, namespace, spec, status)
    training = found.child
    problem = None
    # Hydra composes for a few hundred milliseconds: off the event loop (and once per list).
    rendered = command.run_overrides(name, spec)
    if training is None and spec.overrides:
        problem = await asyncio.to_thread(overrides.check, rendered, len(spec.overrides))
    config = await asyncio.to_thread(overrides.composed, rendered)
    code_found = None
    custom = spec.custom_agent_loop
    if training is None and custom is not None and custom.config_map:
        code = await rt.client.get("v1", "ConfigMap", namespace, custom.config_map)
        code_found = code is not None
    preflight_job: Object | None = None
    messages: dict[str, str] = {}
    if spec.preflight.enabled and training is None:
        preflight_job, messages = await _preflight(rt, name, namespace)
    return lifecycle.Observed(
        pool=first,
        more_pools=tuple(others),
        preflight_job=preflight_job,
        preflight_messages=messages,
        training=training,
        trainer_pod=found.trainer_pod,
        earlier_trainer_pods=found.earlier_pods,
        trainer_log=found.trainer_log,
        earlier_trainer_log=found.earlier_trainer_log,
        rayjob_served=found.rayjob_served,
        queued=found.queued,
        override_problem=problem,
        custom_loop_code_found=code_found,
        demand=None if config is None else demand.of_config(config, spec),
    )


async def _carry_out(rt: Runtime, run: Object, plan: lifecycle.Plan) -> lifecycle.Plan:
    """Create what the plan says; a child the API server rejects fails the run with its reason."""
    meta = run["metadata"]
    for obj in plan.create:
        try:
            await rt.client.apply(obj)
        except KubeError as error:
            if error.status not in (400, 403, 404, 422):
                raise
            plan = lifecycle.rejected(
                plan.status, obj, str(error), meta.get("generation", 1), runs.now()
            )
            break
    training = plan.status.training
    if plan.suspend_child is not None and training is not None:
        await rt.client.patch(
            training.api_version,
            training.kind,
            meta["namespace"],
            training.name,
            {"spec": {"suspend": plan.suspend_child}},
        )
    return plan


async def reconcile(rt: Runtime, namespace: str, name: str) -> lifecycle.Plan | None:
    """One level-based pass over a run; None when the run is gone."""
    run = await rt.client.get(API_VERSION, KIND, namespace, name)
    if run is None or run["metadata"].get("deletionTimestamp"):
        return None
    spec = TrainingRunSpec.model_validate(run["spec"])
    previous = TrainingRunStatus.model_validate(run.get("status") or {})
    if lifecycle.is_finished(previous):
        observed = lifecycle.Observed(pool=None)
    else:
        observed = await observe(rt, name, namespace, spec, previous)
    planned = lifecycle.plan(runs.identity(rt, run), spec, previous, observed, runs.now())
    plan = await _carry_out(rt, run, planned)
    if plan.status != previous:
        await rt.client.patch_status(API_VERSION, KIND, namespace, name, plan.status.to_patch())
    metrics.RUNS.set(KIND, namespace, name, (plan.status.phase.value,))
    if (progress := plan.status.progress) is not None:
        metrics.RUN_PROGRESS.set(
            namespace, name, progress.step, progress.total_steps, progress.mean_reward
        )
    await runs.announce(rt, run, plan, spec.ttl_seconds_after_finished, "run")
    return plan


def next_pass(settings: OperatorSettings, plan: lifecycle.Plan | None) -> float | None:
    """When the run's next reconcile is due, after a pass that planned this."""
    if plan is None:
        return None
    finished, training = lifecycle.is_finished(plan.status), lifecycle.reads_progress(plan.status)
    return runs.next_pass(settings, plan, finished, training)


# The event handlers that only wake a run's daemon (main.QuietWakers keeps its log lines out).
RUN_WAKERS = (
    "trainingrun_changed",
    "trainingrun_child_changed",
    "trainingrun_pool_changed",
    "trainingrun_workload_changed",
)


def _register_wakers(registry: kopf.OperatorRegistry, training_runs: runs.Runs) -> None:
    # Async, so they run on the event loop: kopf runs a plain function in a worker thread, and an
    # asyncio.Event set from there wakes its waiter late or not at all (not thread-safe).
    run_children = {RUN_LABEL: kopf.PRESENT}

    @kopf.on.event(GROUP, VERSION, PLURAL, id=RUN_WAKERS[0], registry=registry)
    async def trainingrun_changed(namespace: str | None, name: str, **_: Any) -> None:
        training_runs.wake((namespaced(namespace), name))

    @kopf.on.event("batch", "v1", "jobs", labels=run_children, id=RUN_WAKERS[1], registry=registry)
    @kopf.on.event(
        "ray.io", "v1", "rayjobs", labels=run_children, id=RUN_WAKERS[1], registry=registry
    )
    async def trainingrun_child_changed(
        namespace: str | None, labels: kopf.Labels, **_: Any
    ) -> None:
        training_runs.wake((namespaced(namespace), labels[RUN_LABEL]))

    @kopf.on.event(GROUP, VERSION, "envpools", id=RUN_WAKERS[2], registry=registry)
    async def trainingrun_pool_changed(namespace: str | None, name: str, **_: Any) -> None:
        training_runs.wake_runs_on(namespace, name)

    # Kueue writes why a run waits (or was preempted) on its Workload: shown at once, not at the
    # next resync. Inactive where Kueue is not installed, as the RayJob waker is without KubeRay.
    @kopf.on.event(
        admission.KUEUE_GROUP,
        admission.KUEUE_VERSION,
        "workloads",
        id=RUN_WAKERS[3],
        registry=registry,
    )
    async def trainingrun_workload_changed(
        namespace: str | None, body: kopf.Body, **_: Any
    ) -> None:
        for run in admission.runs_owning(dict(body)):
            training_runs.wake((namespaced(namespace), run))


def register(registry: kopf.OperatorRegistry, rt: Runtime) -> None:
    """Register the TrainingRun handlers on a registry (tests build their own)."""
    training_runs = runs.Runs()
    _register_wakers(registry, training_runs)

    async def reconcile_run(namespace: str, name: str) -> float | None:
        return next_pass(rt.settings, await reconcile(rt, namespace, name))

    runs.register_daemon(registry, training_runs, KIND, PLURAL, reconcile_run)
