"""kopf handlers for EnvPool: unpack → pure builder/decision → apply → status. Each stays short."""

import asyncio
import contextlib
import dataclasses
import logging
import time
from typing import Any

import aiohttp
import kopf

from gymkube_operator.conditions import ConditionStatus, find_condition, now_rfc3339
from gymkube_operator.envpool import builders, pods
from gymkube_operator.envpool.builders import ENVSERVER, ROUTER
from gymkube_operator.envpool.models import PLURAL, EnvPoolSpec, EnvPoolStatus
from gymkube_operator.envpool.prober import observe
from gymkube_operator.envpool.restarts import record_actions, restart_times
from gymkube_operator.envpool.status import DEGRADED, Observed, compute_status
from gymkube_operator.envpool.watchdog import Action, Memory, Plan, decide
from gymkube_operator.kinds import GROUP, VERSION
from gymkube_operator.kube import KubeError
from gymkube_operator.labels import COMPONENT_LABEL, POOL_LABEL
from gymkube_operator.objects import Object
from gymkube_operator.runtime import Runtime, namespaced

logger = logging.getLogger(__name__)

PoolKey = tuple[str, str]
WAKE_DEBOUNCE_SECONDS = 0.2
PoolIndex = kopf.Index[PoolKey, Object]
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
    """What the operator knows about one pool between handler calls.

    The operator is the only writer of an EnvPool's status, so the status it last wrote is fresher
    than the body kopf hands over (whose watch event may still be in flight). Both writers, the
    reconcile handler and the watchdog, hold the lock while they compute and write.
    """

    lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)
    wake: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    memory: Memory = dataclasses.field(default_factory=Memory)
    written: EnvPoolStatus | None = None

    def previous(self, body: kopf.Body) -> EnvPoolStatus:
        return self.written if self.written is not None else _status(body)


async def _apply_children(
    rt: Runtime, name: str, namespace: str, uid: str, spec: EnvPoolSpec
) -> Observed:
    owner = builders.owner(name, namespace, uid)
    children = builders.build_children(owner, spec, rt.settings)
    try:
        applied = await asyncio.gather(*(rt.client.apply(child) for child in children))
    except KubeError as error:
        return Observed(statefulset=None, router=None, apply_error=str(error))
    by_kind = {obj["kind"]: obj for obj in applied}
    return Observed(statefulset=by_kind["StatefulSet"], router=by_kind["Deployment"])


async def _remove_network_policy(rt: Runtime, name: str, namespace: str, uid: str) -> None:
    """With network policies turned off, a policy this pool got earlier goes (a same-named one the
    user made stays)."""
    api_version, kind = "networking.k8s.io/v1", "NetworkPolicy"
    policy_name = builders.network_policy_name(name)
    try:
        found = await rt.client.get(api_version, kind, namespace, policy_name)
        owners = (found or {}).get("metadata", {}).get("ownerReferences", [])
        if found is not None and any(ref.get("uid") == uid for ref in owners):
            policy_uid = found["metadata"]["uid"]
            await rt.client.delete(api_version, kind, namespace, policy_name, policy_uid)
    except KubeError as error:
        logger.warning("could not remove NetworkPolicy %s/%s: %s", namespace, policy_name, error)


async def _write_status(
    rt: Runtime, state: PoolState, name: str, namespace: str, status: EnvPoolStatus
) -> None:
    api_version = f"{GROUP}/{VERSION}"
    written = await rt.client.patch_status(api_version, "EnvPool", namespace, name, status.to_api())
    state.written = EnvPoolStatus.model_validate(written.get("status") or {})


async def reconcile(
    rt: Runtime,
    state: PoolState,
    name: str,
    namespace: str,
    uid: str,
    body: kopf.Body,
    generation: int,
) -> None:
    spec = builders.parse_spec(body["spec"])
    async with state.lock:
        observed = await _apply_children(rt, name, namespace, uid, spec)
        if not rt.settings.network_policy:
            await _remove_network_policy(rt, name, namespace, uid)
        previous = state.previous(body)
        status = compute_status(
            name=name,
            namespace=namespace,
            generation=generation,
            spec=spec,
            previous=previous,
            observed=observed,
            now=now_rfc3339(),
        )
        await _write_status(rt, state, name, namespace, status)
    _announce_degradation(body, previous, status)
    if observed.apply_error:
        raise kopf.TemporaryError(f"applying children failed: {observed.apply_error}", delay=10)


async def _carry_out(
    rt: Runtime,
    plan: Plan,
    by_uid: dict[str, Object],
    spec: EnvPoolSpec,
    namespace: str,
    body: kopf.Body,
) -> list[tuple[Action, bool]]:
    """Delete and drain what the plan says; return (action, is_restart) for what was done."""
    done: list[tuple[Action, bool]] = []
    for action in plan.restart + plan.recycle:
        is_restart = action in plan.restart
        # A hung server ignores SIGTERM and its preStop drain would wait on it: a restart
        # kills at once, while a recycled (drained) pod keeps its graceful stop.
        grace = 0 if is_restart else None
        if await rt.client.delete("v1", "Pod", namespace, action.pod, action.uid, grace):
            kind = "Warning" if is_restart else "Normal"
            verb = "PodRestarted" if is_restart else "PodRecycled"
            kopf.event(body, type=kind, reason=verb, message=_describe(action))
            done.append((action, is_restart))
    for action in plan.drain:
        address = rt.resolve(by_uid[action.uid], spec.admin_port)
        if address is None:
            continue
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            timeout = aiohttp.ClientTimeout(total=spec.watchdog.probe_timeout_seconds)
            async with rt.probes.post(f"{address}/admin/drain", timeout=timeout):
                pass
        kopf.event(body, type="Normal", reason="PodDraining", message=_describe(action))
    return done


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


async def watch_once(
    rt: Runtime,
    state: PoolState,
    name: str,
    namespace: str,
    uid: str,
    body: kopf.Body,
    indexes: tuple[PoolIndex, ...],
) -> None:
    """One watchdog period: probe the pods, act on the plan, and refresh the status."""
    statefulsets, routers, pods_index = indexes
    key = (namespace, name)
    spec = builders.parse_spec(body["spec"])
    found = [] if spec.suspend else list(pods_index.get(key, []))
    observations = await observe(
        rt.probes, found, spec.port, spec.watchdog, rt.resolve, rt.probe_limit
    )
    troubles = await _troubles(rt, namespace, found)
    async with state.lock:
        previous = state.previous(body)
        if not previous.observed_generation:
            return  # the first reconcile has not run yet
        now = time.time()
        plan = decide(
            observations, state.memory, spec.watchdog, restart_times(previous.restarts), now
        )
        by_uid = {p["metadata"]["uid"]: p for p in found}
        done = await _carry_out(rt, plan, by_uid, spec, namespace, body)
        observed = Observed(
            statefulset=_first(statefulsets, key),
            router=_first(routers, key),
            pods=observations,
            troubles=troubles,
            budget_exhausted=plan.budget_exhausted and bool(plan.held),
        )
        if observed.statefulset is None or observed.router is None:
            # A child went missing (deleted by hand): put it back, level-based.
            observed = await _apply_children(rt, name, namespace, uid, spec)
        status = compute_status(
            name=name,
            namespace=namespace,
            # Only a reconcile of the current spec may claim it was observed.
            generation=previous.observed_generation,
            spec=spec,
            previous=previous,
            observed=observed,
            restarts=record_actions(previous.restarts, done, now_rfc3339()),
            now=now_rfc3339(),
        )
        if status != previous:
            await _write_status(rt, state, name, namespace, status)
        _announce_degradation(body, previous, status)


def _announce_degradation(body: kopf.Body, before: EnvPoolStatus, after: EnvPoolStatus) -> None:
    """A Warning Event when the pool turns Degraded for a new reason (once, not every period)."""
    old = find_condition(before.conditions, DEGRADED)
    new = find_condition(after.conditions, DEGRADED)
    if new is None or new.status != ConditionStatus.TRUE:
        return
    if old is None or (old.status, old.reason) != (new.status, new.reason):
        kopf.event(body, type="Warning", reason=new.reason, message=new.message)


async def _wake_when_stopped(stopped: kopf.DaemonStopped, wake: asyncio.Event) -> None:
    await stopped.wait()
    wake.set()


def register(registry: kopf.OperatorRegistry, rt: Runtime) -> None:
    """Register the EnvPool handlers on a registry (tests build their own runtime and registry)."""
    pools: dict[PoolKey, PoolState] = {}

    def keyed(namespace: str | None, labels: kopf.Labels, value: Object) -> dict[PoolKey, Object]:
        key = (namespaced(namespace), labels[POOL_LABEL])
        # A child changed: wake the pool's watchdog so its status follows within moments.
        if (state := pools.get(key)) is not None:
            state.wake.set()
        return {key: value}

    # Indexes replace API reads in the watchdog; async, so they run on the event loop.
    @kopf.index(
        "statefulsets",
        id="envpool_statefulsets",
        labels={POOL_LABEL: kopf.PRESENT},
        registry=registry,
    )
    @kopf.index(
        "deployments",
        id="envpool_routers",
        labels={POOL_LABEL: kopf.PRESENT, COMPONENT_LABEL: ROUTER},
        registry=registry,
    )
    async def envpool_workloads(
        namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any
    ) -> dict[PoolKey, Object]:
        return keyed(namespace, labels, _slim_workload(body))

    @kopf.index(
        "pods",
        id="envpool_pods",
        labels={POOL_LABEL: kopf.PRESENT, COMPONENT_LABEL: ENVSERVER},
        registry=registry,
    )
    async def envpool_pods(
        namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any
    ) -> dict[PoolKey, Object]:
        return {(namespaced(namespace), labels[POOL_LABEL]): pods.slim_pod(dict(body))}

    @kopf.on.resume(GROUP, VERSION, PLURAL, id="envpool_reconcile", registry=registry)
    @kopf.on.create(GROUP, VERSION, PLURAL, id="envpool_reconcile", registry=registry)
    @kopf.on.update(GROUP, VERSION, PLURAL, id="envpool_reconcile", registry=registry)
    async def reconcile_envpool(
        name: str, namespace: str | None, uid: str, body: kopf.Body, meta: kopf.Meta, **_: Any
    ) -> None:
        key = (namespaced(namespace), name)
        state = pools.setdefault(key, PoolState())
        await reconcile(rt, state, name, key[0], uid, body, meta.get("generation", 1))

    @kopf.daemon(
        GROUP,
        VERSION,
        PLURAL,
        id="envpool_watchdog",
        # On stop it finishes its current period (at most a probe timeout) and exits.
        cancellation_backoff=5,
        cancellation_timeout=5,
        registry=registry,
    )
    async def envpool_watchdog(
        name: str,
        namespace: str | None,
        uid: str,
        body: kopf.Body,
        stopped: kopf.DaemonStopped,
        logger: kopf.Logger,
        **kwargs: Any,
    ) -> None:
        key = (namespaced(namespace), name)
        state = pools.setdefault(key, PoolState())
        # kopf passes each index as a keyword argument named by its id.
        indexes = (
            kwargs["envpool_statefulsets"],
            kwargs["envpool_routers"],
            kwargs["envpool_pods"],
        )
        # Stopping (pool deleted, operator exiting) wakes the loop at once instead of after a
        # whole period.
        stopping = asyncio.create_task(_wake_when_stopped(stopped, state.wake))
        try:
            while not stopped:
                state.wake.clear()
                try:
                    await watch_once(rt, state, name, key[0], uid, body, indexes)
                except (KubeError, aiohttp.ClientError, TimeoutError) as error:
                    # The API server is unreachable or refused a write: try again next period.
                    logger.warning(f"watchdog period failed: {error}")
                period = builders.parse_spec(body["spec"]).watchdog.probe_period_seconds
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(state.wake.wait(), timeout=period)
                    if not stopped:
                        # Let a burst of child events (and their index updates) land first.
                        await asyncio.sleep(WAKE_DEBOUNCE_SECONDS)
        finally:
            stopping.cancel()
            pools.pop(key, None)
