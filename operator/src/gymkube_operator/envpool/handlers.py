"""kopf handlers for EnvPool: one daemon per pool, each pass observe → decide → act → status."""

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import Callable
from typing import Any

import kopf

from gymkube_operator import metrics
from gymkube_operator.conditions import ConditionStatus, find_condition, now_rfc3339
from gymkube_operator.envpool import autoscale, builders, pods
from gymkube_operator.envpool.builders import ROUTER
from gymkube_operator.envpool.fetch import get_page
from gymkube_operator.envpool.models import OPENENV, PLURAL, EnvPoolSpec, EnvPoolStatus
from gymkube_operator.envpool.podwatch import PoolPods
from gymkube_operator.envpool.prober import drain, observe
from gymkube_operator.envpool.reasons import Degraded
from gymkube_operator.envpool.restarts import record_actions, restart_times
from gymkube_operator.envpool.status import DEGRADED, READY, Observed, compute_status
from gymkube_operator.envpool.watchdog import Action, Memory, Plan, decide
from gymkube_operator.kinds import GROUP, VERSION
from gymkube_operator.kube import KubeError
from gymkube_operator.labels import COMPONENT_LABEL, POOL_LABEL
from gymkube_operator.objects import Object
from gymkube_operator.runtime import Runtime, namespaced, reconcile_until_stopped
from gymkube_operator.trainingrun.models import Phase

logger = logging.getLogger(__name__)

PoolKey = tuple[str, str]
WAKE_DEBOUNCE_SECONDS = 0.2
PoolIndex = kopf.Index[PoolKey, Object]
# The indexes a pass reads, by kopf id, in Pool.indexes order.
STATEFULSETS_INDEX, ROUTERS_INDEX, DEMAND_INDEX = (
    "envpool_statefulsets",
    "envpool_routers",
    "envpool_run_demand",
)
INDEX_IDS = (STATEFULSETS_INDEX, ROUTERS_INDEX, DEMAND_INDEX)
# The event handler that only wakes a pool's daemon (main.QuietWakers keeps its log lines out).
POOL_WAKER = "envpool_changed"
ORPHAN_FINALIZER = "orphan"
FINISHED_PHASES = (Phase.SUCCEEDED, Phase.FAILED)
Keyed = Callable[[str | None, kopf.Labels, Object], dict[PoolKey, Object]]
# The status fields of a StatefulSet or Deployment the pool status reads; indexes keep only these
# (and only what the watchdog reads of pods, envpool.pods.slim_pod) to bound the operator's memory.
WORKLOAD_STATUS = (
    "replicas",
    "readyReplicas",
    "updatedReplicas",
    "observedGeneration",
    "currentRevision",
    "updateRevision",
)


def _slim_workload(body: kopf.Body) -> Object:
    status = body.get("status", {})
    return {
        "kind": body["kind"],
        "metadata": {"generation": body["metadata"].get("generation", 1)},
        "status": {k: status[k] for k in WORKLOAD_STATUS if k in status},
    }


def _describe(action: Action) -> str:
    return f"{action.pod}: {action.reason}: {action.message}"


def _status(body: kopf.Body) -> EnvPoolStatus:
    return EnvPoolStatus.model_validate(body.get("status") or {})


def _first(index: kopf.Index[PoolKey, Object], key: PoolKey) -> Object | None:
    return next(iter(index.get(key, [])), None)


@dataclasses.dataclass
class PoolState:
    """What one pool's daemon keeps between its passes.

    The daemon is the only writer of the pool's status, so the status it last wrote is fresher
    than the body kopf hands over (whose watch event may still be in flight)."""

    wake: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    memory: Memory = dataclasses.field(default_factory=Memory)
    written: EnvPoolStatus | None = None
    applied_generation: int | None = None  # the spec generation whose children were applied
    scale: autoscale.ScaleMemory = dataclasses.field(default_factory=autoscale.ScaleMemory)

    def previous(self, body: kopf.Body) -> EnvPoolStatus:
        return self.written if self.written is not None else _status(body)


@dataclasses.dataclass(frozen=True)
class Pool:
    """One EnvPool as a pass sees it: identity, current spec, the operator's indexes and the
    pools' pods."""

    name: str
    namespace: str
    uid: str
    generation: int
    spec: EnvPoolSpec
    indexes: tuple[PoolIndex, ...]
    all_pods: PoolPods

    @property
    def key(self) -> PoolKey:
        return (self.namespace, self.name)

    def children(self) -> Observed:
        statefulsets, routers, *_ = self.indexes
        return Observed(
            statefulset=_first(statefulsets, self.key), router=_first(routers, self.key)
        )

    def pods(self) -> list[Object]:
        return [] if self.spec.suspend else self.all_pods.servers(self.namespace, self.name)

    def router_pods(self) -> list[Object]:
        return self.all_pods.routers(self.namespace, self.name)

    def demand(self) -> int:
        """Sessions the unfinished runs that use the pool keep open (their status.demand)."""
        shares: Any = self.indexes[2].get(self.key, [])
        return sum(int(share) for share in shares)


async def _apply_children(rt: Runtime, state: PoolState, pool: Pool) -> Observed:
    """Apply the wanted children (and drop a NetworkPolicy that is no longer wanted)."""
    owner = builders.owner(pool.name, pool.namespace, pool.uid)
    children = builders.build_children(owner, pool.spec, rt.settings)
    try:
        async with rt.apply_limit:
            applied = await asyncio.gather(*(rt.client.apply(child) for child in children))
    except KubeError as error:
        state.applied_generation = None  # try again next pass
        return Observed(statefulset=None, router=None, apply_error=str(error))
    if not rt.settings.network_policy:
        await _remove_network_policy(rt, pool)
    state.applied_generation = pool.generation
    by_kind = {obj["kind"]: obj for obj in applied}
    return Observed(statefulset=by_kind["StatefulSet"], router=by_kind["Deployment"])


async def _remove_network_policy(rt: Runtime, pool: Pool) -> None:
    """With network policies turned off, a policy this pool got earlier goes (a same-named one the
    user made stays)."""
    api_version, kind = "networking.k8s.io/v1", "NetworkPolicy"
    policy_name = builders.network_policy_name(pool.name)
    try:
        found = await rt.client.get(api_version, kind, pool.namespace, policy_name)
        owners = (found or {}).get("metadata", {}).get("ownerReferences", [])
        if found is not None and any(ref.get("uid") == pool.uid for ref in owners):
            policy_uid = found["metadata"]["uid"]
            await rt.client.delete(api_version, kind, pool.namespace, policy_name, policy_uid)
    except KubeError as error:
        logger.warning(
            "could not remove NetworkPolicy %s/%s: %s", pool.namespace, policy_name, error
        )


async def _troubles(rt: Runtime, namespace: str, found: list[Object]) -> list[pods.PodTrouble]:
    """Why pods are not coming up; the kubelet's Events are read only for pods whose status
    cannot tell a startup-probe kill from an exit (a restarted container not up again)."""

    async def events(pod: Object) -> list[Object]:
        if not pods.startup_suspect(pod):
            return []
        uid = pod["metadata"]["uid"]
        try:
            return await rt.client.list(
                "v1", "Event", namespace, fields=f"involvedObject.uid={uid}"
            )
        except KubeError as error:
            # Without Events (say, RBAC from an older chart) the pod's status still tells most.
            logger.warning("no Events of pod %s/%s: %s", namespace, pod["metadata"]["name"], error)
            return []

    read = await asyncio.gather(*(events(pod) for pod in found))
    troubles = (pods.pod_trouble(pod, seen) for pod, seen in zip(found, read, strict=True))
    return [trouble for trouble in troubles if trouble is not None]


async def _observe(rt: Runtime, state: PoolState, pool: Pool) -> Observed:
    """The children (applied first when the spec changed or one went missing), every pod's
    /status, and why pods are not coming up."""
    children = pool.children()
    if state.applied_generation != pool.generation or None in (
        children.statefulset,
        children.router,
    ):
        children = await _apply_children(rt, state, pool)
    found = pool.pods()
    probed = await observe(
        rt.probes,
        found,
        pool.spec.port,
        pool.spec.watchdog,
        rt.resolve,
        rt.probe_limit,
        openenv=pool.spec.env == OPENENV,
    )
    troubles = await _troubles(rt, pool.namespace, found)
    return dataclasses.replace(children, pods=probed, troubles=troubles)


async def _act(rt: Runtime, plan: Plan, pool: Pool, body: kopf.Body) -> list[tuple[Action, bool]]:
    """Delete and drain what the plan says; return (action, is_restart) for what was deleted."""
    done: list[tuple[Action, bool]] = []
    for action in plan.restart + plan.recycle:
        is_restart = action in plan.restart
        # A hung server ignores SIGTERM and its preStop drain would wait on it: a restart
        # kills at once, while a recycled (drained) pod keeps its graceful stop.
        grace = 0 if is_restart else None
        if await rt.client.delete("v1", "Pod", pool.namespace, action.pod, action.uid, grace):
            kind, verb = ("Warning", "PodRestarted") if is_restart else ("Normal", "PodRecycled")
            kopf.event(body, type=kind, reason=verb, message=_describe(action))
            done.append((action, is_restart))
    by_uid = {pod["metadata"]["uid"]: pod for pod in pool.pods()}
    for action in plan.drain:
        address = rt.resolve(by_uid[action.uid], pool.spec.admin_port)
        if address is not None:
            await drain(rt.probes, address, pool.spec.watchdog)
            kopf.event(body, type="Normal", reason="PodDraining", message=_describe(action))
    return done


async def reconcile_once(rt: Runtime, state: PoolState, pool: Pool, body: kopf.Body) -> float:
    """One pass: observe → decide → act → status. Returns the seconds until the next pass."""
    started = time.monotonic()
    observed = await _observe(rt, state, pool)
    previous = state.previous(body)
    restarts = restart_times(previous.restarts)
    plan = decide(observed.pods, state.memory, pool.spec.watchdog, restarts, time.time())
    for seen in observed.pods:
        if seen.probe is not None:
            failure = seen.probe.failure
            metrics.PROBES.labels("ok" if failure is None else failure.value).inc()
    done = await _act(rt, plan, pool, body)
    for action, is_restart in done:
        metrics.POD_ACTIONS.labels("restart" if is_restart else "recycle", action.reason).inc()
    held = plan.budget_exhausted and bool(plan.held)
    status = compute_status(
        name=pool.name,
        namespace=pool.namespace,
        generation=pool.generation,
        spec=pool.spec,
        previous=previous,
        observed=dataclasses.replace(observed, budget_exhausted=held),
        restarts=record_actions(previous.restarts, done, now_rfc3339()),
        now=now_rfc3339(),
    )
    if pool.spec.autoscaling is not None:
        waiting = await _waiting_sessions(rt, pool)
        status = status.model_copy(update={"demand": pool.demand(), "waiting_sessions": waiting})
    await _write_status(rt, state, pool, previous, status)
    await _autoscale(rt, state, pool, status, body)
    metrics.POOLS.set("EnvPool", pool.namespace, pool.name, _health(status))
    _announce_degradation(body, previous, status)
    # Passes start a period apart, however long the probes took: a frozen pod (a probe timeout
    # per pass) is still restarted within failureThreshold periods.
    return pool.spec.watchdog.probe_period_seconds - (time.monotonic() - started)


async def _autoscale(
    rt: Runtime, state: PoolState, pool: Pool, status: EnvPoolStatus, body: kopf.Body
) -> None:
    """Write spec.replicas when the autoscaler wants another size; the next pass applies it."""
    demand, waiting = status.demand or 0, status.waiting_sessions or 0
    scale = autoscale.decide(
        pool.spec, demand, status.active_sessions, waiting, state.scale, time.monotonic()
    )
    if scale is None:
        return
    api_version = f"{GROUP}/{VERSION}"
    patch = {"spec": {"replicas": scale.replicas}}
    await rt.client.patch(api_version, "EnvPool", pool.namespace, pool.name, patch)
    kopf.event(body, type="Normal", reason="Scaled", message=scale.message)


async def _waiting_sessions(rt: Runtime, pool: Pool) -> int:
    """New sessions the pool's routers hold for room now (their /status); a router that does not
    answer counts none (its Deployment's readiness shows in the pool's status)."""

    async def held(pod: Object) -> int:
        address = rt.resolve(pod, pool.spec.port)
        if address is None:
            return 0
        async with rt.probe_limit:
            text, failed = await get_page(rt.probes, address, "/status", pool.spec.watchdog)
        if failed is not None:
            return 0
        try:
            return max(0, int(json.loads(text).get("waiting", 0)))
        except (ValueError, TypeError, AttributeError):
            return 0

    return sum(await asyncio.gather(*(held(pod) for pod in pool.router_pods())))


async def _write_status(
    rt: Runtime, state: PoolState, pool: Pool, previous: EnvPoolStatus, status: EnvPoolStatus
) -> None:
    """Patch the status only when it changed: a steady pool costs the API server no writes."""
    if status == previous:
        return
    api_version = f"{GROUP}/{VERSION}"
    written = await rt.client.patch_status(
        api_version, "EnvPool", pool.namespace, pool.name, status.to_api()
    )
    state.written = EnvPoolStatus.model_validate(written.get("status") or {})


def _health(status: EnvPoolStatus) -> tuple[str, str]:
    """(Ready's status, Degraded's reason when it is True, else Healthy), for the metrics."""
    ready = find_condition(status.conditions, READY)
    degraded = find_condition(status.conditions, DEGRADED)
    if degraded is None or degraded.status != ConditionStatus.TRUE:
        degraded = None
    return (
        "true" if ready is not None and ready.status == ConditionStatus.TRUE else "false",
        Degraded.HEALTHY.value if degraded is None else degraded.reason,
    )


def _announce_degradation(body: kopf.Body, before: EnvPoolStatus, after: EnvPoolStatus) -> None:
    """A Warning Event when the pool turns Degraded for a new reason (once, not every period)."""
    old = find_condition(before.conditions, DEGRADED)
    new = find_condition(after.conditions, DEGRADED)
    if new is None or new.status != ConditionStatus.TRUE:
        return
    if old is None or (old.status, old.reason) != (new.status, new.reason):
        kopf.event(body, type="Warning", reason=new.reason, message=new.message)


def _register_indexes(
    registry: kopf.OperatorRegistry, keyed: Keyed, wake: Callable[[PoolKey], None]
) -> None:
    """Indexes of each pool's StatefulSet and router Deployment, and of the demand of the runs
    that use it: they replace API reads in each pass (the pods come from PoolPods). Async, so
    they run on the event loop."""
    # Label filters: a value or kopf.PRESENT.
    router: dict[str, Any] = {POOL_LABEL: kopf.PRESENT, COMPONENT_LABEL: ROUTER}
    pool = {POOL_LABEL: kopf.PRESENT}

    # Each by group and version: a resource named by plural alone makes kopf read every API group
    # the cluster serves, and one aggregated API that does not answer (a metrics-server down,
    # Kueue's visibility API) then stalls the operator's start.
    @kopf.index("apps", "v1", "statefulsets", id=STATEFULSETS_INDEX, labels=pool, registry=registry)
    @kopf.index("apps", "v1", "deployments", id=ROUTERS_INDEX, labels=router, registry=registry)
    async def envpool_workloads(
        namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any
    ) -> dict[PoolKey, Object]:
        return keyed(namespace, labels, _slim_workload(body))

    @kopf.index(GROUP, VERSION, "trainingruns", id=DEMAND_INDEX, registry=registry)
    async def envpool_run_demand(
        namespace: str | None, status: kopf.Status, **_: Any
    ) -> dict[PoolKey, int]:
        # A finished run keeps its status.demand as a record; it wants no session.
        if status.get("phase") in FINISHED_PHASES:
            return {}
        shares = (status.get("demand") or {}).get("pools") or {}
        found = {(namespaced(namespace), pool): int(n) for pool, n in shares.items()}
        for key in found:
            wake(key)
        return found


class Pools:
    """Each live pool's state by key; watch events on a pool or its children wake its daemon."""

    def __init__(self) -> None:
        self.states: dict[PoolKey, PoolState] = {}

    def wake(self, key: PoolKey) -> None:
        if (state := self.states.get(key)) is not None:
            state.wake.set()

    def keyed(
        self, namespace: str | None, labels: kopf.Labels, value: Object
    ) -> dict[PoolKey, Object]:
        key = (namespaced(namespace), labels[POOL_LABEL])
        self.wake(key)  # a child changed: the pool's status follows within moments
        return {key: value}


def _pool(
    name: str,
    namespace: str,
    uid: str,
    body: kopf.Body,
    indexes: tuple[PoolIndex, ...],
    all_pods: PoolPods,
) -> Pool:
    """The pool as this pass sees it (body is kopf's live view of the object)."""
    spec = builders.parse_spec(body["spec"])
    generation = body["metadata"].get("generation", 1)
    return Pool(name, namespace, uid, generation, spec, indexes, all_pods)


def _register_daemon(
    registry: kopf.OperatorRegistry, rt: Runtime, pools: Pools, all_pods: PoolPods
) -> None:
    # On stop a daemon finishes its current pass (at most a probe timeout) and exits.
    @kopf.daemon(
        GROUP, VERSION, PLURAL, id="envpool_watchdog", cancellation_backoff=5,
        cancellation_timeout=5, registry=registry,
    )  # fmt: skip
    async def envpool_daemon(
        name: str, namespace: str | None, uid: str, body: kopf.Body, stopped: kopf.DaemonStopped,
        **kwargs: Any,
    ) -> None:  # fmt: skip
        key = (namespaced(namespace), name)
        state = pools.states.setdefault(key, PoolState())
        # kopf passes each index as a keyword argument named by its id.
        indexes = tuple(kwargs[index_id] for index_id in INDEX_IDS)

        async def pass_once() -> float:
            pool = _pool(name, key[0], uid, body, indexes, all_pods)
            return await reconcile_once(rt, state, pool, body)

        try:
            # A pass before the pods were first listed would see a pool without servers.
            await all_pods.synced.wait()
            what = f"EnvPool {key[0]}/{name}"
            await reconcile_until_stopped(
                "EnvPool", what, pass_once, state.wake, stopped, WAKE_DEBOUNCE_SECONDS
            )
        finally:
            pools.states.pop(key, None)
            metrics.POOLS.forget("EnvPool", *key)


async def stop_servers(rt: Runtime, namespace: str, pool: str) -> int:
    """Stops a deleted pool's env servers within GRACE_AFTER_DRAIN instead of letting each drain
    for up to drainTimeoutSeconds: with the pool's router and Service going, no client can reach
    their sessions again, and a session its client abandoned would hold the drain to the end.
    Returns how many pods were stopped."""
    # The StatefulSet first, so that it does not replace the pods deleted next; its pods orphaned,
    # or the garbage collector may delete them first with their whole drain grace, which the
    # kubelet then keeps even when the grace is shortened after.
    await rt.client.delete("apps/v1", "StatefulSet", namespace, pool, propagation_policy="Orphan")
    stopped = 0
    for pod in await rt.client.list("v1", "Pod", namespace, builders.selector_string(pool)):
        meta = pod["metadata"]
        grace = builders.GRACE_AFTER_DRAIN
        if await rt.client.delete("v1", "Pod", namespace, meta["name"], meta["uid"], grace):
            stopped += 1
    return stopped


def register(registry: kopf.OperatorRegistry, rt: Runtime) -> None:
    """Register the EnvPool handlers on a registry (tests build their own runtime and registry).

    One daemon per pool does every pass, so a pool is never reconciled twice at once; events on
    the pool and its children only wake it."""
    pools = Pools()

    # Async, so it runs on the event loop (see trainingrun.handlers._register_wakers).
    @kopf.on.event(GROUP, VERSION, PLURAL, id=POOL_WAKER, registry=registry)
    async def envpool_changed(namespace: str | None, name: str, **_: Any) -> None:
        pools.wake((namespaced(namespace), name))

    # `kubectl delete --cascade=orphan` asks to keep the children: it adds the orphan finalizer.
    @kopf.on.delete(GROUP, VERSION, PLURAL, id="envpool_stop_servers", registry=registry)
    async def envpool_deleted(
        name: str, namespace: str | None, meta: kopf.Meta, body: kopf.Body, **_: Any
    ) -> None:
        if ORPHAN_FINALIZER in (meta.get("finalizers") or []):
            return
        stopped = await stop_servers(rt, namespaced(namespace), name)
        if stopped:
            kopf.event(
                body,
                type="Normal",
                reason="ServersStopped",
                message=f"stopped {stopped} env servers",
            )

    all_pods = PoolPods(list(rt.settings.namespaces) or [None])
    following: list[asyncio.Task[None]] = []

    @kopf.on.startup(registry=registry)
    async def envpool_follow_pods(**_: Any) -> None:
        following.extend(
            asyncio.create_task(all_pods.follow(lambda: rt.client, scope))
            for scope in all_pods.scopes
        )

    @kopf.on.cleanup(registry=registry)
    async def envpool_stop_following_pods(**_: Any) -> None:
        for task in following:
            task.cancel()
        await asyncio.gather(*following, return_exceptions=True)

    _register_indexes(registry, pools.keyed, pools.wake)
    _register_daemon(registry, rt, pools, all_pods)
