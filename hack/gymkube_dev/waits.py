"""`make up`'s wait for its examples: every pool Ready, the GPU run's preflight passed, the CPU
run Succeeded; every change printed, a pool or run that no waiting will fix failing at once."""

import time
from dataclasses import dataclass, field

from gymkube_operator.envpool.reasons import STUCK
from gymkube_operator.envpool.reasons import ConditionType as Pool
from gymkube_operator.trainingrun.reasons import ConditionType as Run

from gymkube_dev.console import HEARTBEAT_S, duration, say
from gymkube_dev.errors import StepError
from gymkube_dev.examples import gymkube_object
from gymkube_dev.kube import Kube
from gymkube_dev.objects import Object, condition, condition_is, current
from gymkube_dev.settings import UpSettings


@dataclass
class Watched:
    """One example object being waited for, with what was last printed about it."""

    kind: str
    name: str
    timeout: float
    started: float = field(default_factory=time.monotonic)
    last: str = ""
    ready_after: float | None = None
    obj: Object | None = None


def trains_on_cpu(obj: Object) -> bool:
    return bool((obj.get("spec") or {}).get("device") == "cpu")


def describe_pool(obj: Object | None) -> str:
    if obj is None:
        return "not found"
    status = obj.get("status") or {}
    parts = [f"{status.get('readyReplicas', 0)}/{obj['spec'].get('replicas', 0)} servers ready"]
    for kind in Pool:
        cond = condition(obj, kind)
        if cond and (kind == Pool.READY or cond.get("status") == "True"):
            parts.append(f"{kind}={cond.get('status')} {cond.get('reason', '')}".rstrip())
    return ", ".join(parts)


def describe_progress(progress: Object) -> str:
    """`step 1/2, reward 0.25, 42s a step, ETA 42s` from status.progress."""
    parts = [f"step {progress.get('step')}/{progress.get('totalSteps') or '?'}"]
    if progress.get("meanReward") is not None:
        parts.append(f"reward {progress['meanReward']:.3f}")
    if progress.get("stepSeconds") is not None:
        parts.append(f"{progress['stepSeconds']:.0f}s a step")
    if progress.get("etaSeconds") is not None:
        parts.append(f"ETA {duration(progress['etaSeconds'])}")
    return ", ".join(parts)


def describe_run(obj: Object | None) -> str:
    if obj is None:
        return "not found"
    status = obj.get("status") or {}
    parts = [f"phase {status.get('phase', 'Pending')}"]
    for kind in (Run.ENV_POOL_READY, Run.PREFLIGHT_PASSED, Run.FAILED):
        cond = condition(obj, kind)
        if cond and (kind != Run.FAILED or cond.get("status") == "True"):
            parts.append(f"{kind}={cond.get('status')} {cond.get('reason', '')}".rstrip())
    if status.get("training"):
        parts.append(f"{status['training']['kind'].lower()}/{status['training']['name']} created")
    if status.get("progress"):
        parts.append(describe_progress(status["progress"]))
    return ", ".join(parts)


def run_done(obj: Object) -> bool:
    """The run got as far as this cluster lets it: a CPU run Succeeded; a GPU run passed its
    preflight and made its training child (without a GPU node, that Job stays Pending)."""
    if trains_on_cpu(obj):
        return condition_is(obj, Run.SUCCEEDED)
    status = obj.get("status") or {}
    return condition_is(obj, Run.PREFLIGHT_PASSED) and bool(status.get("training"))


def pool_failed(obj: Object) -> str | None:
    """A pool that needs a human: waiting longer will not make it Ready (the operator names
    those Degraded reasons, docs/envpool.md)."""
    degraded = condition(obj, Pool.DEGRADED)
    if degraded and degraded.get("status") == "True" and degraded.get("reason") in STUCK:
        return f"Degraded {degraded.get('reason')}: {degraded.get('message')}"
    return None


def run_failed(obj: Object) -> str | None:
    if condition_is(obj, Run.FAILED):
        failed = condition(obj, Run.FAILED) or {}
        return f"{failed.get('reason')}: {failed.get('message')}"
    preflight = condition(obj, Run.PREFLIGHT_PASSED)
    if preflight and preflight.get("status") == "False":
        return f"preflight failed: {preflight.get('message')}"
    return None


def wait_timeout(settings: UpSettings, obj: Object) -> float:
    if obj["kind"] == "EnvPool":
        return settings.pool_timeout_s
    training = settings.training_timeout_s if trains_on_cpu(obj) else 0.0
    return settings.pool_timeout_s + settings.preflight_timeout_s + training


def watch(settings: UpSettings, objects: list[Object]) -> list[Watched]:
    return [
        Watched(obj["kind"], obj["metadata"]["name"], wait_timeout(settings, obj))
        for obj in objects
        if obj["kind"] in ("EnvPool", "TrainingRun")
    ]


def check_one(kube: Kube, settings: UpSettings, item: Watched) -> bool:
    """Reads ITEM once, printing a change; True once it is done. StepError when it failed or
    timed out."""
    item.obj = obj = gymkube_object(kube, item.kind, settings.namespace, item.name)
    pool = item.kind == "EnvPool"
    text = describe_pool(obj) if pool else describe_run(obj)
    if text != item.last:
        say(f"  {item.kind.lower()}/{item.name}: {text}")
        item.last = text
    if obj is not None and current(obj):
        failure = pool_failed(obj) if pool else run_failed(obj)
        if failure:
            raise StepError(f"{item.kind.lower()}/{item.name} failed: {failure}")
        if (pool and condition_is(obj, Pool.READY)) or (not pool and run_done(obj)):
            item.ready_after = time.monotonic() - item.started
            what = "Ready" if pool else "Succeeded" if trains_on_cpu(obj) else "preflight passed"
            say(f"  {item.kind.lower()}/{item.name}: {what} {duration(item.ready_after)}")
            return True
    if time.monotonic() - item.started >= item.timeout:
        raise StepError(
            f"{item.kind.lower()}/{item.name} not ready after {duration(item.timeout)}: {text}"
        )
    return False


def wait_examples(kube: Kube, settings: UpSettings, watched: list[Watched]) -> None:
    """Polls every example until each is ready, printing every change, in one loop."""
    last_heartbeat = time.monotonic()
    while True:
        pending = [
            item
            for item in watched
            if item.ready_after is None and not check_one(kube, settings, item)
        ]
        if not pending:
            return
        if time.monotonic() - last_heartbeat >= HEARTBEAT_S:
            waiting = ", ".join(
                f"{i.kind.lower()}/{i.name} ({duration(time.monotonic() - i.started)})"
                for i in pending
            )
            say(f"  ... waiting for {waiting}")
            last_heartbeat = time.monotonic()
        time.sleep(settings.poll_interval_s)
