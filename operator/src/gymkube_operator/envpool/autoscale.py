"""How many env servers an autoscaled pool wants, from its runs' demand and its open sessions.

Growing is at once: a run's batch opens all its sessions within a second, and a server takes
seconds to be Ready. Shrinking waits until fewer servers have been enough for
autoscaling.scaleDownDelaySeconds (as an HPA's stabilization window: the highest recommendation
in that window wins), since a GRPO step opens no session during its update phase; to zero, for
idleTimeoutSeconds at least. A StatefulSet removes its highest ordinals, and each such server's
preStop drain lets its live sessions finish first (docs/envpool.md), so no session is cut.
"""

import collections
import dataclasses
import math

from gymkube_operator.envpool.models import AutoscalingSpec, EnvPoolSpec


def recommend(auto: AutoscalingSpec, sessions_per_replica: int, demand: int, active: int) -> int:
    """Servers for the runs' demand, and for the open sessions at the target utilization."""
    by_demand = math.ceil(demand / sessions_per_replica)
    by_load = math.ceil(active * 100 / (sessions_per_replica * auto.target_utilization_percent))
    return min(auto.max_replicas, max(auto.min_replicas, by_demand, by_load))


@dataclasses.dataclass
class ScaleMemory:
    """One pool's recent recommendations (the operator's memory: a restart starts a new window,
    which only delays a shrink)."""

    since: float | None = None
    recent: collections.deque[tuple[float, int]] = dataclasses.field(
        default_factory=collections.deque
    )


@dataclasses.dataclass(frozen=True)
class Scale:
    replicas: int
    message: str


def decide(
    spec: EnvPoolSpec, demand: int, active: int, waiting: int, memory: ScaleMemory, now: float
) -> Scale | None:
    """The replicas an autoscaled pool should have now, when they differ from spec.replicas;
    sessions the routers hold (waiting) count as open ones."""
    auto = spec.autoscaling
    if auto is None or spec.suspend:
        return None
    want = recommend(auto, spec.sessions_per_replica, demand, active + waiting)
    to_zero_after = max(auto.scale_down_delay_seconds, spec.idle_timeout_seconds)
    if memory.since is None:
        memory.since = now
    memory.recent.append((now, want))
    while memory.recent and memory.recent[0][0] < now - to_zero_after:
        memory.recent.popleft()
    why = f"runs' demand {demand} sessions, {active} open, {waiting} waiting"
    current = spec.replicas
    if want > current:
        return Scale(want, f"{current} -> {want} env servers: {why}")
    if want == current:
        return None
    # The highest recommendation over the window; zero only when it held for the longer one.
    window = auto.scale_down_delay_seconds
    target = max(r for t, r in memory.recent if t >= now - window)
    if target == 0:
        target = max(r for _, r in memory.recent)
        if target == 0:
            window = to_zero_after
    if target >= current or now - memory.since < window:
        return None
    return Scale(target, f"{current} -> {target} env servers: {why} for {window} s")
