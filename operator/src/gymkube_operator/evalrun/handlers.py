"""kopf handlers for EvalRun: read what exists → pure plan → apply, patch, post Events.

One daemon per eval does every reconcile (gymkube_operator.runs); watch events on the eval, its
pool and its Job only wake that daemon.
"""

import logging
from typing import Any

import aiohttp
import kopf

from gymkube_operator import metrics, runs
from gymkube_operator.evalrun import lifecycle, readings, render
from gymkube_operator.evalrun.models import KIND, PLURAL, EvalRunSpec, EvalRunStatus
from gymkube_operator.kinds import API_VERSION, GROUP, VERSION
from gymkube_operator.kube import KubeError
from gymkube_operator.labels import EVAL_RUN_LABEL
from gymkube_operator.objects import Object
from gymkube_operator.runtime import Runtime, namespaced
from gymkube_operator.settings import OperatorSettings
from gymkube_operator.trainingrun.models import KIND as TRAINING_RUN

logger = logging.getLogger(__name__)

# gymkube-eval's log lines a reconcile reads: the last progress line, or the result line.
LOG_TAIL_LINES = 200


async def _newest_pod(rt: Runtime, namespace: str, job: str) -> Object | None:
    pods = await rt.client.list("v1", "Pod", namespace, f"batch.kubernetes.io/job-name={job}")
    return max(pods, key=lambda pod: pod["metadata"].get("creationTimestamp", ""), default=None)


async def _eval_log(rt: Runtime, namespace: str, pod: Object | None) -> str | None:
    if pod is None or not readings.started(pod, render.EVAL):
        return None
    name = pod["metadata"]["name"]
    try:
        return await rt.client.pod_log(namespace, name, render.EVAL, LOG_TAIL_LINES)
    except (KubeError, aiohttp.ClientError, TimeoutError) as error:
        logger.warning("no gymkube-eval log from pod %s/%s: %s", namespace, name, error)
        return None


async def observe(rt: Runtime, name: str, namespace: str, spec: EvalRunSpec) -> lifecycle.Observed:
    """Read the pool, the eval Job (its newest pod and log), and until the Job exists the
    TrainingRun the model names."""
    pool = await rt.client.get(API_VERSION, "EnvPool", namespace, spec.env_pool_ref.name)
    job = await rt.client.get(render.JOB_API, "Job", namespace, render.job_name(name))
    checkpoint = spec.model.training_run
    if job is None:
        training_run = None
        if checkpoint is not None:
            training_run = await rt.client.get(
                API_VERSION, TRAINING_RUN, namespace, checkpoint.name
            )
        return lifecycle.Observed(pool=pool, training_run=training_run)
    pod = await _newest_pod(rt, namespace, job["metadata"]["name"])
    log = await _eval_log(rt, namespace, pod)
    return lifecycle.Observed(pool=pool, job=job, pod=pod, log=log)


async def _carry_out(rt: Runtime, obj: Object, plan: lifecycle.Plan) -> lifecycle.Plan:
    """Create what the plan says; a child the API server rejects fails the eval with its reason."""
    for child in plan.create:
        try:
            await rt.client.apply(child)
        except KubeError as error:
            if error.status not in (400, 403, 404, 422):
                raise
            generation = obj["metadata"].get("generation", 1)
            return lifecycle.rejected(plan.status, child, str(error), generation, runs.now())
    return plan


async def reconcile(rt: Runtime, namespace: str, name: str) -> lifecycle.Plan | None:
    """One level-based pass over an eval; None when it is gone."""
    obj = await rt.client.get(API_VERSION, KIND, namespace, name)
    if obj is None or obj["metadata"].get("deletionTimestamp"):
        return None
    spec = EvalRunSpec.model_validate(obj["spec"])
    previous = EvalRunStatus.model_validate(obj.get("status") or {})
    if lifecycle.is_finished(previous):
        observed = lifecycle.Observed(pool=None)
    else:
        observed = await observe(rt, name, namespace, spec)
    planned = lifecycle.plan(runs.identity(rt, obj), spec, previous, observed, runs.now())
    plan = await _carry_out(rt, obj, planned)
    if plan.status != previous:
        await rt.client.patch_status(API_VERSION, KIND, namespace, name, plan.status.to_api())
    metrics.RUNS.set(KIND, namespace, name, (plan.status.phase.value,))
    await runs.announce(rt, obj, plan, spec.ttl_seconds_after_finished, "eval")
    return plan


def next_pass(settings: OperatorSettings, plan: lifecycle.Plan | None) -> float | None:
    """When the eval's next reconcile is due, after a pass that planned this."""
    if plan is None:
        return None
    finished, playing = lifecycle.is_finished(plan.status), lifecycle.reads_progress(plan.status)
    return runs.next_pass(settings, plan, finished, playing)


# The event handlers that only wake an eval's daemon (main.QuietWakers keeps their log lines out).
EVAL_WAKERS = ("evalrun_changed", "evalrun_job_changed", "evalrun_pool_changed")


def _register_wakers(registry: kopf.OperatorRegistry, evals: runs.Runs) -> None:
    @kopf.on.event(GROUP, VERSION, PLURAL, id=EVAL_WAKERS[0], registry=registry)
    async def evalrun_changed(namespace: str | None, name: str, **_: Any) -> None:
        evals.wake((namespaced(namespace), name))

    children = {EVAL_RUN_LABEL: kopf.PRESENT}

    @kopf.on.event("batch", "v1", "jobs", labels=children, id=EVAL_WAKERS[1], registry=registry)
    async def evalrun_job_changed(namespace: str | None, labels: kopf.Labels, **_: Any) -> None:
        evals.wake((namespaced(namespace), labels[EVAL_RUN_LABEL]))

    @kopf.on.event(GROUP, VERSION, "envpools", id=EVAL_WAKERS[2], registry=registry)
    async def evalrun_pool_changed(namespace: str | None, name: str, **_: Any) -> None:
        evals.wake_runs_on(namespace, name)


def register(registry: kopf.OperatorRegistry, rt: Runtime) -> None:
    """Register the EvalRun handlers on a registry (tests build their own)."""
    evals = runs.Runs()
    _register_wakers(registry, evals)

    async def reconcile_eval(namespace: str, name: str) -> float | None:
        return next_pass(rt.settings, await reconcile(rt, namespace, name))

    runs.register_daemon(registry, evals, KIND, PLURAL, reconcile_eval)
