"""Reads each env-server pod's GET /status and turns the answer into a watchdog Probe."""

import asyncio
import contextlib
import json
import time
from collections.abc import Callable

import aiohttp
from pydantic import BaseModel, ValidationError

from gymkube_operator.conditions import parse_rfc3339
from gymkube_operator.envpool.fetch import get_page
from gymkube_operator.envpool.models import WatchdogSpec
from gymkube_operator.envpool.openenv_probe import probe_openenv_server
from gymkube_operator.envpool.watchdog import Failure, PodObservation, Probe
from gymkube_operator.objects import Object
from gymkube_operator.settings import DEFAULT_PROBE_ADDRESS

# Maps a pod to the base URL of its env server, or None while it cannot be probed. Tests point
# it at local env-server processes standing in for pods.
AddressResolver = Callable[[Object, int], str | None]


def address_resolver(template: str = DEFAULT_PROBE_ADDRESS) -> AddressResolver:
    """Resolves a pod, once it runs and its startup probe passed, to the template filled in with
    its IP, the port, its name, namespace and uid (settings.probe_address_template); None before."""

    def resolve(pod: Object, port: int) -> str | None:
        status = pod.get("status", {})
        containers = status.get("containerStatuses", [])
        started = bool(containers) and all(c.get("started") for c in containers)
        if status.get("phase") != "Running" or not status.get("podIP") or not started:
            return None
        meta = pod["metadata"]
        return template.format(
            pod_ip=status["podIP"],
            port=port,
            name=meta["name"],
            namespace=meta.get("namespace", ""),
            uid=meta["uid"],
        )

    return resolve


class _Canary(BaseModel):
    ok: bool | None = None
    at: float | None = None
    error: str | None = None


class _ServerStatus(BaseModel):
    """The fields of the env server's /status the watchdog reads."""

    active: int
    capacity: int
    served: int
    draining: bool
    ready: bool
    canary: _Canary


def judge(body: object, policy: WatchdogSpec, now: float) -> Probe:
    """Turn a /status body into a Probe (pure: the unit tests feed it bodies directly)."""
    try:
        status = _ServerStatus.model_validate(body)
    except ValidationError as error:
        return Probe(Failure.BAD_STATUS, f"/status body unreadable: {error.errors()[0]['msg']}")
    canary = status.canary
    failure: Failure | None = None
    message = ""
    stale_after = (
        policy.canary_interval_seconds + policy.canary_timeout_seconds + policy.probe_period_seconds
    )
    # The canary pauses while the server warms up or drains; otherwise it must keep running.
    if canary.ok is False:
        failure, message = Failure.CANARY_FAILED, f"canary failed: {canary.error or 'no detail'}"
    elif (
        policy.canary_interval_seconds
        and status.ready
        and not status.draining
        and canary.at is not None
        and now - canary.at > stale_after
    ):
        failure = Failure.STUCK
        message = f"canary last ran {int(now - canary.at)}s ago (limit {stale_after}s)"
    return Probe(
        failure,
        message,
        active=status.active,
        served=status.served,
        draining=status.draining,
    )


async def probe_server(
    session: aiohttp.ClientSession, base_url: str, policy: WatchdogSpec
) -> Probe:
    text, failed = await get_page(session, base_url, "/status", policy)
    if failed is not None:
        return failed
    try:
        body = json.loads(text)
    except ValueError as error:
        return Probe(Failure.NO_ANSWER, f"/status failed: {type(error).__name__}: {error}")
    return judge(body, policy, time.time())


def _age_seconds(pod: Object, now: float) -> float:
    created = pod["metadata"].get("creationTimestamp")
    if not created:
        return 0.0
    started = parse_rfc3339(created).timestamp()
    return max(0.0, now - started)


async def observe(
    session: aiohttp.ClientSession,
    pods: list[Object],
    port: int,
    policy: WatchdogSpec,
    resolve: AddressResolver,
    limit: asyncio.Semaphore,
    openenv: bool = False,
) -> list[PodObservation]:
    """Probe every pod that has an address, concurrently (bounded by limit); ``openenv`` when
    the pods run OpenEnv servers rather than gymkube's."""
    probe_one = probe_openenv_server if openenv else probe_server

    async def one(pod: Object) -> PodObservation:
        meta = pod["metadata"]
        deleting = bool(meta.get("deletionTimestamp"))
        address = None if deleting else resolve(pod, port)
        probe = None
        if address is not None:
            async with limit:
                probe = await probe_one(session, address, policy)
        return PodObservation(
            name=meta["name"],
            uid=meta["uid"],
            age_seconds=_age_seconds(pod, time.time()),
            deleting=deleting,
            probe=probe,
        )

    return list(await asyncio.gather(*(one(pod) for pod in pods)))


async def drain(session: aiohttp.ClientSession, address: str, policy: WatchdogSpec) -> None:
    """POST /admin/drain: the server takes no new sessions and finishes its live ones. One that
    does not answer is asked again at the next pass (the plan keeps naming it)."""
    with contextlib.suppress(aiohttp.ClientError, TimeoutError):
        timeout = aiohttp.ClientTimeout(total=policy.probe_timeout_seconds)
        async with session.post(f"{address}/admin/drain", timeout=timeout):
            pass
