"""The autoscaler's decisions over time: up at once for a run's demand or a full pool, down only
after fewer servers were enough for the delay, to zero only after the idle timeout."""

from typing import Any

import pytest
from gymkube_operator.envpool import autoscale
from gymkube_operator.envpool.autoscale import ScaleMemory
from gymkube_operator.envpool.models import EnvPoolSpec

pytestmark = pytest.mark.unit


def pool(replicas: int, **autoscaling: Any) -> EnvPoolSpec:
    return EnvPoolSpec.model_validate(
        {
            "env": "frozen_lake",
            "replicas": replicas,
            "sessionsPerReplica": 8,
            "idleTimeoutSeconds": 600,
            "autoscaling": {"maxReplicas": 10, "scaleDownDelaySeconds": 60, **autoscaling},
        }
    )


def replicas_over(spec: EnvPoolSpec, passes: list[tuple[float, int, int]]) -> list[int]:
    """spec.replicas after each pass (time, demand, open sessions), as the operator writes it."""
    memory, seen = ScaleMemory(), []
    for now, demand, active in passes:
        scale = autoscale.decide(spec, demand, active, 0, memory, now)
        if scale is not None:
            spec = spec.model_copy(update={"replicas": scale.replicas})
        seen.append(spec.replicas)
    return seen


def test_a_runs_demand_scales_the_pool_up_at_once_within_its_bounds() -> None:
    # 20 sessions of 8 per server: 3; 200: capped at maxReplicas.
    assert replicas_over(pool(1), [(0, 20, 0), (5, 200, 0)]) == [3, 10]


def test_open_sessions_past_the_target_utilization_grow_the_pool() -> None:
    # 7 of 8 open is past 80 %: a second server before the next create is refused.
    assert replicas_over(pool(1), [(0, 0, 6), (5, 0, 7)]) == [1, 2]


def test_the_pool_shrinks_only_after_fewer_servers_were_enough_for_the_delay() -> None:
    # A step's update phase (no session open) must not shrink it; a minute of less does.
    passes = [(0, 24, 18), (30, 8, 0), (59, 8, 0), (95, 8, 0)]
    assert replicas_over(pool(3), passes) == [3, 3, 3, 1]


def test_a_new_peak_inside_the_delay_keeps_the_pool() -> None:
    passes = [(0, 8, 0), (30, 24, 0), (70, 8, 0), (80, 8, 0), (95, 8, 0)]
    assert replicas_over(pool(1), passes) == [1, 3, 3, 3, 1]


def test_to_zero_only_after_the_idle_timeout_with_no_run_and_no_session() -> None:
    spec = pool(2, minReplicas=0)
    passes = [(0, 0, 0), (61, 0, 0), (599, 0, 0), (601, 0, 0)]
    assert replicas_over(spec, passes) == [2, 2, 2, 0]
    # And up again when a run comes.
    assert replicas_over(pool(0, minReplicas=0), [(0, 16, 0)]) == [2]


def test_the_floor_holds_without_demand_and_a_suspended_pool_is_left_alone() -> None:
    assert replicas_over(pool(3, minReplicas=2), [(0, 0, 0), (100, 0, 0)]) == [3, 2]
    suspended = pool(1).model_copy(update={"suspend": True})
    assert autoscale.decide(suspended, 100, 0, 0, ScaleMemory(), 0) is None


def test_a_create_the_routers_hold_at_zero_starts_a_server() -> None:
    # No run, nothing open: a client's /create held by a router is the only load.
    scale = autoscale.decide(pool(0, minReplicas=0), 0, 0, 1, ScaleMemory(), 0)
    assert scale is not None
    assert scale.replicas == 1
    assert scale.message == "0 -> 1 env servers: runs' demand 0 sessions, 0 open, 1 waiting"


def test_the_scale_message_says_why() -> None:
    scale = autoscale.decide(pool(1), 20, 3, 0, ScaleMemory(), 0)
    assert scale is not None
    assert scale.message == "1 -> 3 env servers: runs' demand 20 sessions, 3 open, 0 waiting"
