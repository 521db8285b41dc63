"""What a TrainingRun and an EvalRun share: both are a Job-backed run with a daemon of its own,
woken by watch events on the run, its children and its pool; both end Succeeded or Failed and
may be deleted a TTL after that. The pure parts (Events, the end, the TTL) come first, then the
handler side (identity, Events posted, the next pass, the daemon)."""

import asyncio
import dataclasses
import datetime
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, cast

import kopf

from gymkube_operator import metrics
from gymkube_operator.conditions import Condition, ConditionStatus, find_condition, parse_rfc3339
from gymkube_operator.kinds import API_VERSION, GROUP, VERSION
from gymkube_operator.objects import Object
from gymkube_operator.runtime import UNTIL_WOKEN, Runtime, namespaced, reconcile_until_stopped
from gymkube_operator.settings import OperatorSettings
from gymkube_operator.trainingrun.command import Run

RunKey = tuple[str, str]
# Both kinds' condition types for the end of a run.
SUCCEEDED, FAILED = "Succeeded", "Failed"


@dataclasses.dataclass(frozen=True)
class Event:
    type: str
    reason: str
    message: str


class RunPlan(Protocol):
    """What a reconcile's plan says beyond the status: its Events, whether the run's TTL is over
    (delete it), and when something is due without any event."""

    events: list[Event]
    delete_expired: bool
    wake_after: float | None


def is_finished(conditions: Sequence[Condition]) -> bool:
    return any(
        (c := find_condition(list(conditions), t)) is not None and c.status == ConditionStatus.TRUE
        for t in (SUCCEEDED, FAILED)
    )


def ttl_remaining(ttl_seconds: int, completion_time: str, now: datetime.datetime) -> float:
    """Seconds until a run that finished at completion_time is due for deletion (0 or less:
    due now)."""
    due = parse_rfc3339(completion_time) + datetime.timedelta(seconds=ttl_seconds)
    return (due - now).total_seconds()


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def identity(rt: Runtime, obj: Object) -> Run:
    """The run's object identity and the operator's images, for the pure builders."""
    meta = obj["metadata"]
    return Run(
        name=meta["name"],
        namespace=meta["namespace"],
        uid=meta["uid"],
        generation=meta.get("generation", 1),
        trainer_image=rt.settings.trainer_image,
        cpu_trainer_image=rt.settings.cpu_trainer_image,
        preflight_image=rt.settings.preflight_image,
        image_pull_policy=rt.settings.image_pull_policy,
    )


async def announce(
    rt: Runtime, obj: Object, plan: RunPlan, ttl_seconds: int | None, what: str
) -> None:
    """The plan's Events; and the run (`what` names it: "run", "eval") deleted when its TTL
    after finishing is over."""
    body, meta = cast(kopf.Body, obj), obj["metadata"]
    for event in plan.events:
        kopf.event(body, type=event.type, reason=event.reason, message=event.message)
    if plan.delete_expired:
        message = f"deleting the {what} {ttl_seconds}s after it finished"
        kopf.event(body, type="Normal", reason="Expired", message=message)
        await rt.client.delete(
            API_VERSION, obj["kind"], meta["namespace"], meta["name"], meta["uid"]
        )


def next_pass(
    settings: OperatorSettings, plan: RunPlan | None, finished: bool, reads_progress: bool
) -> float | None:
    """When a run's next reconcile is due, after a pass that planned this (None: the run is
    gone), given whether the run is finished and whether its pod's log is being read."""
    if plan is None or plan.delete_expired:
        return None
    if plan.wake_after is not None:
        return min(settings.trainingrun_resync_seconds, plan.wake_after)
    if finished:
        # A finished run without a TTL is a record: only an edit (a TTL added later) wakes it.
        return UNTIL_WOKEN
    if reads_progress:
        # No watch event tells of a step or an episode played: the log is read this often.
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


Reconcile = Callable[[str, str], Awaitable[float | None]]
"""One pass over the run (namespace, name): seconds until the next, as next_pass says."""


def register_daemon(
    registry: kopf.OperatorRegistry, runs: Runs, kind: str, plural: str, reconcile: Reconcile
) -> None:
    """One daemon per run of this kind: it does every reconcile, so a run is never reconciled
    twice at once; the kind's watch handlers only wake it (runs.wake)."""

    daemon_id = f"{kind.lower()}_daemon"

    @kopf.daemon(GROUP, VERSION, plural, id=daemon_id, cancellation_timeout=5, registry=registry)
    async def run_daemon(
        name: str, namespace: str | None, spec: kopf.Spec, stopped: kopf.DaemonStopped, **_: Any
    ) -> None:
        key = (namespaced(namespace), name)
        event = runs.wakes.setdefault(key, asyncio.Event())

        async def reconcile_once() -> float | None:
            runs.pools[key] = spec.get("envPoolRef", {}).get("name", "")
            return await reconcile(key[0], name)

        try:
            what = f"{kind} {key[0]}/{name}"
            await reconcile_until_stopped(kind, what, reconcile_once, event, stopped)
        finally:
            runs.wakes.pop(key, None)
            runs.pools.pop(key, None)
            metrics.RUNS.forget(kind, *key)
            if kind == "TrainingRun":
                metrics.RUN_PROGRESS.forget(*key)
