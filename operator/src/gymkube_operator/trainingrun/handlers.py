"""kopf handlers for TrainingRun: read what exists → pure plan → apply, patch, post Events.

One daemon per run does every reconcile, so a run is never reconciled twice at once; watch
events on its pool, its Jobs and its RayJob only wake that daemon.
"""

import asyncio
import datetime
import logging
from typing import Any, cast

import aiohttp
import kopf

from gymkube_operator.kinds import API_VERSION, GROUP, VERSION
from gymkube_operator.kube import KubeError
from gymkube_operator.labels import RUN_LABEL
from gymkube_operator.objects import Object
from gymkube_operator.runtime import UNTIL_WOKEN, Runtime, namespaced, reconcile_until_stopped
from gymkube_operator.settings import OperatorSettings
from gymkube_operator.trainingrun import command, lifecycle, overrides, readings, render
from gymkube_operator.trainingrun.models import KIND, PLURAL, TrainingRunSpec, TrainingRunStatus

logger = logging.getLogger(__name__)

RunKey = tuple[str, str]
# How much of the trainer's log a reconcile reads for its last progress line: many steps' output.
LOG_TAIL_LINES = 2000


async def _job_pods(rt: Runtime, namespace: str, job: str) -> list[Object]:
    """The Job's pods, newest first."""
    pods = await rt.client.list("v1", "Pod", namespace, f"batch.kubernetes.io/job-name={job}")
    pods.sort(key=lambda pod: pod["metadata"].get("creationTimestamp", ""), reverse=True)
    return pods


async def _termination_message(rt: Runtime, namespace: str, job: str) -> str | None:
    """The preflight container's termination message from the Job's newest finished pod."""
    for pod in await _job_pods(rt, namespace, job):
        status = readings.container_status(pod, render.PREFLIGHT) or {}
        terminated = (status.get("state") or {}).get("terminated") or {}
        if "message" in terminated:
            message: str = terminated["message"]
            return message
    return None


async def _trainer(rt: Runtime, namespace: str, job: str) -> tuple[Object | None, str | None]:
    """The training Job's newest pod, and the tail of its trainer's log once the trainer started
    (None when the kubelet cannot give it now: progress waits for the next read)."""
    pods = await _job_pods(rt, namespace, job)
    newest = pods[0] if pods else None
    if newest is None or not readings.trainer_started(newest):
        return newest, None
    pod = newest["metadata"]["name"]
    try:
        return newest, await rt.client.pod_log(namespace, pod, render.TRAINER, LOG_TAIL_LINES)
    except (KubeError, aiohttp.ClientError, TimeoutError) as error:
        logger.warning("no trainer log from pod %s/%s: %s", namespace, pod, error)
        return newest, None


async def _training(
    rt: Runtime, name: str, namespace: str, spec: TrainingRunSpec, status: TrainingRunStatus
) -> tuple[Object | None, Object | None, str | None, bool | None]:
    """The training Job or RayJob (None while RayJob is not served), a Job's newest pod and its
    trainer log, and whether the API server serves RayJob (None when not asked)."""
    if status.training is not None:
        api_version, kind = status.training.api_version, status.training.kind
    else:
        api_version, kind = render.training_api_version(spec.nodes)
    served = await rt.client.served(render.RAYJOB_API, "rayjobs") if kind == "RayJob" else None
    if served is False:
        return None, None, None, served
    training = await rt.client.get(api_version, kind, namespace, render.training_name(name))
    if training is None or kind != "Job":
        return training, None, None, served
    pod, log = await _trainer(rt, namespace, render.training_name(name))
    return training, pod, log, served


async def _preflight(rt: Runtime, name: str, namespace: str) -> tuple[Object | None, str | None]:
    """The preflight Job, and its verdict once it finished."""
    job_name = render.preflight_job_name(name)
    job = await rt.client.get("batch/v1", "Job", namespace, job_name)
    if job is None or not readings.job_finished(job):
        return job, None
    return job, await _termination_message(rt, namespace, job_name)


async def observe(
    rt: Runtime, name: str, namespace: str, spec: TrainingRunSpec, status: TrainingRunStatus
) -> lifecycle.Observed:
    """Read the pool and the run's children (fixed names, one GET each), and for a training Job
    its newest pod and trainer log."""
    pool = await rt.client.get(API_VERSION, "EnvPool", namespace, spec.env_pool_ref.name)
    training, trainer_pod, trainer_log, served = await _training(rt, name, namespace, spec, status)
    problem = None
    if training is None and spec.overrides:
        # Hydra composes for a few hundred milliseconds: off the event loop (and once per list).
        rendered = command.run_overrides(name, spec)
        problem = await asyncio.to_thread(overrides.check, rendered, len(spec.overrides))
    preflight_job = message = None
    if spec.preflight.enabled and training is None:
        preflight_job, message = await _preflight(rt, name, namespace)
    return lifecycle.Observed(
        pool=pool,
        preflight_job=preflight_job,
        preflight_message=message,
        training=training,
        trainer_pod=trainer_pod,
        trainer_log=trainer_log,
        rayjob_served=served,
        override_problem=problem,
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
                plan.status, obj, str(error), meta.get("generation", 1), _now()
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


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _identity(rt: Runtime, run: Object) -> command.Run:
    meta = run["metadata"]
    return command.Run(
        name=meta["name"],
        namespace=meta["namespace"],
        uid=meta["uid"],
        generation=meta.get("generation", 1),
        trainer_image=rt.settings.trainer_image,
        cpu_trainer_image=rt.settings.cpu_trainer_image,
        preflight_image=rt.settings.preflight_image,
        image_pull_policy=rt.settings.image_pull_policy,
    )


async def _announce(rt: Runtime, run: Object, spec: TrainingRunSpec, plan: lifecycle.Plan) -> None:
    """The plan's Events; and the run deleted when its TTL after finishing is over."""
    body, meta = cast(kopf.Body, run), run["metadata"]
    for event in plan.events:
        kopf.event(body, type=event.type, reason=event.reason, message=event.message)
    if plan.delete_run:
        message = f"deleting the run {spec.ttl_seconds_after_finished}s after it finished"
        kopf.event(body, type="Normal", reason="Expired", message=message)
        await rt.client.delete(API_VERSION, KIND, meta["namespace"], meta["name"], meta["uid"])


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
    planned = lifecycle.plan(_identity(rt, run), spec, previous, observed, _now())
    plan = await _carry_out(rt, run, planned)
    if plan.status != previous:
        await rt.client.patch_status(API_VERSION, KIND, namespace, name, plan.status.to_patch())
    await _announce(rt, run, spec, plan)
    return plan


def next_pass(settings: OperatorSettings, plan: lifecycle.Plan | None) -> float | None:
    """When the run's next reconcile is due, after a pass that planned this."""
    if plan is None or plan.delete_run:
        return None
    if plan.wake_after is not None:
        return min(settings.trainingrun_resync_seconds, plan.wake_after)
    if lifecycle.is_finished(plan.status):
        # A finished run without a TTL is a record: only an edit (a TTL added later) wakes it.
        return UNTIL_WOKEN
    if lifecycle.reads_progress(plan.status):
        # No watch event tells of a new step: the trainer's log is read this often.
        return min(settings.trainingrun_resync_seconds, settings.trainingrun_progress_seconds)
    return settings.trainingrun_resync_seconds


class Runs:
    """Each run daemon's wake-up event, and the pool each run reads (so a pool's change wakes
    the runs on it)."""

    def __init__(self) -> None:
        self.wakes: dict[RunKey, asyncio.Event] = {}
        self.pools: dict[RunKey, str] = {}

    def wake(self, key: RunKey) -> None:
        event = self.wakes.get(key)
        if event is not None:
            event.set()

    def wake_runs_on(self, namespace: str | None, pool: str) -> None:
        for key, name in list(self.pools.items()):
            if key[0] == namespace and name == pool:
                self.wake(key)


# The event handlers that only wake a run's daemon (main.QuietWakers keeps its log lines out).
RUN_WAKERS = ("trainingrun_changed", "trainingrun_child_changed", "trainingrun_pool_changed")


def _register_wakers(registry: kopf.OperatorRegistry, runs: Runs) -> None:
    # Async, so they run on the event loop: kopf runs a plain function in a worker thread, and an
    # asyncio.Event set from there wakes its waiter late or not at all (not thread-safe).
    run_children = {RUN_LABEL: kopf.PRESENT}

    @kopf.on.event(GROUP, VERSION, PLURAL, id=RUN_WAKERS[0], registry=registry)
    async def trainingrun_changed(namespace: str | None, name: str, **_: Any) -> None:
        runs.wake((namespaced(namespace), name))

    @kopf.on.event("batch", "v1", "jobs", labels=run_children, id=RUN_WAKERS[1], registry=registry)
    @kopf.on.event(
        "ray.io", "v1", "rayjobs", labels=run_children, id=RUN_WAKERS[1], registry=registry
    )
    async def trainingrun_child_changed(
        namespace: str | None, labels: kopf.Labels, **_: Any
    ) -> None:
        runs.wake((namespaced(namespace), labels[RUN_LABEL]))

    @kopf.on.event(GROUP, VERSION, "envpools", id=RUN_WAKERS[2], registry=registry)
    async def trainingrun_pool_changed(namespace: str | None, name: str, **_: Any) -> None:
        runs.wake_runs_on(namespace, name)


def _register_daemon(registry: kopf.OperatorRegistry, rt: Runtime, runs: Runs) -> None:
    @kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=5, registry=registry)
    async def trainingrun_daemon(
        name: str, namespace: str | None, spec: kopf.Spec, stopped: kopf.DaemonStopped, **_: Any
    ) -> None:
        key = (namespaced(namespace), name)
        event = runs.wakes.setdefault(key, asyncio.Event())

        async def reconcile_once() -> float | None:
            runs.pools[key] = spec.get("envPoolRef", {}).get("name", "")
            return next_pass(rt.settings, await reconcile(rt, key[0], name))

        try:
            await reconcile_until_stopped(
                f"TrainingRun {key[0]}/{name}", reconcile_once, event, stopped
            )
        finally:
            runs.wakes.pop(key, None)
            runs.pools.pop(key, None)


def register(registry: kopf.OperatorRegistry, rt: Runtime) -> None:
    """Register the TrainingRun handlers on a registry (tests build their own)."""
    runs = Runs()
    _register_wakers(registry, runs)
    _register_daemon(registry, rt, runs)
