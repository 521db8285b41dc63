"""Watchdog decisions as pure functions: observations of the pool's pods in, a plan out.

The prober (envpool/prober.py) turns pods into observations; the handler carries out the plan.
Nothing here talks to a cluster or a clock, so every rule is unit-tested directly.
"""

import dataclasses
from enum import StrEnum

from gymkube_operator.envpool.models import WatchdogSpec


class Failure(StrEnum):
    """Why a probe of an env server failed (CamelCase: it becomes a restart reason)."""

    NO_ANSWER = "NoAnswer"  # refused, reset, timed out: the process is dead or hung
    BAD_STATUS = "BadStatus"  # answered, but not a 200 with a /status body
    CANARY_FAILED = "CanaryFailed"  # the server's own canary episode failed
    STUCK = "Stuck"  # answers, but its canary stopped running


class Recycle(StrEnum):
    MAX_SESSIONS = "MaxSessionsServed"
    MAX_AGE = "MaxAge"
    DRAINED = "Drained"
    DRAIN_TIMEOUT = "DrainTimeout"


@dataclasses.dataclass(frozen=True)
class Probe:
    """One read of a pod's /status."""

    failure: Failure | None
    message: str = ""
    active: int = 0
    served: int = 0
    draining: bool = False


@dataclasses.dataclass(frozen=True)
class PodObservation:
    name: str
    uid: str
    age_seconds: float
    deleting: bool
    # None when the pod has no address yet (pending, starting): it is not probed.
    probe: Probe | None


@dataclasses.dataclass(frozen=True)
class Action:
    pod: str
    uid: str
    reason: str
    message: str


@dataclasses.dataclass
class Memory:
    """What the watchdog remembers between periods (lost on operator restart, on purpose harmless:
    counts start again from zero, drains restart their clock)."""

    failures: dict[str, int] = dataclasses.field(default_factory=dict)  # uid → consecutive
    draining_since: dict[str, float] = dataclasses.field(default_factory=dict)  # uid → time


@dataclasses.dataclass(frozen=True)
class Plan:
    restart: list[Action]  # delete now: failed failureThreshold probes in a row
    drain: list[Action]  # POST /admin/drain: due for recycling
    recycle: list[Action]  # delete now: drained and empty, or past the drain timeout
    held: list[Action]  # wanted a restart, but the restart budget or backoff said wait
    budget_exhausted: bool


def restart_backoff(restarts_in_window: int, policy: WatchdogSpec) -> float:
    """Seconds to wait after the last restart: 0, then one period, doubling, at most the window."""
    if restarts_in_window == 0:
        return 0.0
    period = policy.probe_period_seconds * 2 ** (restarts_in_window - 1)
    return float(min(period, policy.restart_window_seconds))


def _recycle_reason(pod: PodObservation, probe: Probe, policy: WatchdogSpec) -> Recycle | None:
    if policy.max_sessions_served and probe.served >= policy.max_sessions_served:
        return Recycle.MAX_SESSIONS
    if policy.max_age_seconds and pod.age_seconds >= policy.max_age_seconds:
        return Recycle.MAX_AGE
    return None


def decide(
    pods: list[PodObservation],
    memory: Memory,
    policy: WatchdogSpec,
    restart_times: list[float],
    now: float,
) -> Plan:
    """Update memory with this period's probes and say which pods to restart, drain or recycle.

    restart_times: when the watchdog restarted pods before (from status.restarts), for the budget.
    """
    live = [p for p in pods if not p.deleting]
    uids = {p.uid for p in live}
    memory.failures = {u: n for u, n in memory.failures.items() if u in uids}
    memory.draining_since = {u: t for u, t in memory.draining_since.items() if u in uids}

    for pod in live:
        if pod.probe is None:
            memory.failures.pop(pod.uid, None)
        elif pod.probe.failure is None:
            memory.failures[pod.uid] = 0
            if pod.probe.draining:
                memory.draining_since.setdefault(pod.uid, now)
        else:
            memory.failures[pod.uid] = memory.failures.get(pod.uid, 0) + 1

    # Pods that serve nobody new right now: being deleted, draining, or not yet answering.
    unavailable = sum(
        1 for p in pods if p.deleting or p.uid in memory.draining_since or p.probe is None
    )
    slots = max(0, policy.max_unavailable - unavailable)

    recent = [t for t in restart_times if now - t < policy.restart_window_seconds]
    budget_exhausted = len(recent) >= policy.restart_budget
    backoff_over = not recent or now - max(recent) >= restart_backoff(len(recent), policy)

    restart: list[Action] = []
    held: list[Action] = []
    recycle: list[Action] = []
    drain: list[Action] = []
    for pod in live:
        if pod.probe is None or pod.uid in memory.draining_since:
            continue
        failures = memory.failures.get(pod.uid, 0)
        if pod.probe.failure is None or failures < policy.failure_threshold:
            continue
        action = Action(
            pod.name,
            pod.uid,
            pod.probe.failure,
            f"{failures} failed probes in a row: {pod.probe.message}",
        )
        if slots and not budget_exhausted and backoff_over and not restart:
            restart.append(action)
            slots -= 1
        else:
            held.append(action)

    for pod in live:
        if pod.uid not in memory.draining_since:
            continue
        waited = now - memory.draining_since[pod.uid]
        probe = pod.probe
        if probe is not None and probe.failure is None and probe.active == 0:
            recycle.append(Action(pod.name, pod.uid, Recycle.DRAINED, "drained: no live sessions"))
        elif waited >= policy.drain_timeout_seconds:
            message = f"drain timeout ({policy.drain_timeout_seconds}s) passed"
            recycle.append(Action(pod.name, pod.uid, Recycle.DRAIN_TIMEOUT, message))

    for pod in live:
        probe = pod.probe
        if probe is None or probe.failure is not None or pod.uid in memory.draining_since:
            continue
        reason = _recycle_reason(pod, probe, policy)
        if reason is None or not slots:
            continue
        message = f"served {probe.served} sessions, age {int(pod.age_seconds)}s"
        drain.append(Action(pod.name, pod.uid, reason, message))
        memory.draining_since[pod.uid] = now
        slots -= 1

    return Plan(
        restart=restart, drain=drain, recycle=recycle, held=held, budget_exhausted=budget_exhausted
    )
