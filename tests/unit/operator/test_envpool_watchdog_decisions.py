"""Watchdog decisions: when a pod is restarted, drained or recycled, and when the watchdog waits."""

from typing import Any

import pytest
from gymkube_operator.envpool.models import WatchdogSpec
from gymkube_operator.envpool.prober import judge
from gymkube_operator.envpool.watchdog import (
    Failure,
    Memory,
    PodObservation,
    Probe,
    Recycle,
    decide,
    restart_backoff,
)

pytestmark = pytest.mark.unit

HEALTHY = Probe(None, active=2, served=10)
DEAD = Probe(Failure.NO_ANSWER, "connection refused")


def policy(**fields: Any) -> WatchdogSpec:
    return WatchdogSpec.model_validate(fields)


def pod(
    name: str, probe: Probe | None, age: float = 60.0, deleting: bool = False
) -> PodObservation:
    return PodObservation(name, f"uid-{name}", age, deleting, probe)


def run_periods(pods: list[PodObservation], rules: WatchdogSpec, periods: int) -> list[list[str]]:
    """Restarts decided in each of several periods; a restarted pod comes back still starting."""
    memory = Memory()
    restarted: list[float] = []
    out = []
    for period in range(periods):
        now = 1000.0 + period * rules.probe_period_seconds
        plan = decide(pods, memory, rules, restarted, now)
        out.append([a.pod for a in plan.restart])
        restarted += [now for _ in plan.restart]
        gone = {a.uid for a in plan.restart}
        pods = [
            PodObservation(p.name, "new-" + p.uid, 0, False, None) if p.uid in gone else p
            for p in pods
        ]
    return out


def test_a_dead_pod_is_restarted_after_failure_threshold_probes() -> None:
    periods = run_periods([pod("a", HEALTHY), pod("b", DEAD)], policy(failureThreshold=3), 3)
    assert periods == [[], [], ["b"]]


def test_one_good_probe_resets_the_count() -> None:
    memory, rules = Memory(), policy(failureThreshold=2)
    decide([pod("b", DEAD)], memory, rules, [], 0)
    decide([pod("b", HEALTHY)], memory, rules, [], 5)
    plan = decide([pod("b", DEAD)], memory, rules, [], 10)
    assert plan.restart == []


def test_restart_carries_the_failure_reason() -> None:
    memory, rules = Memory(), policy(failureThreshold=1)
    hung = Probe(Failure.CANARY_FAILED, "canary failed: step timed out")
    (action,) = decide([pod("a", hung)], memory, rules, [], 0).restart
    assert action.reason == "CanaryFailed"
    assert "step timed out" in action.message


def test_pods_without_an_address_are_neither_probed_nor_restarted() -> None:
    periods = run_periods([pod("starting", None)], policy(failureThreshold=1), 3)
    assert periods == [[], [], []]


def test_pods_being_deleted_are_left_alone() -> None:
    periods = run_periods([pod("a", DEAD, deleting=True)], policy(failureThreshold=1), 2)
    assert periods == [[], []]


def test_restarts_back_off_between_consecutive_restarts() -> None:
    rules = policy(failureThreshold=1, probePeriodSeconds=5, maxUnavailable=3)
    periods = run_periods([pod("a", DEAD), pod("b", DEAD), pod("c", DEAD)], rules, 5)
    # 0 s wait after no restarts, then 5 s (one period), then 10 s.
    assert periods == [["a"], ["b"], [], ["c"], []]
    assert [restart_backoff(n, rules) for n in range(4)] == [0, 5, 10, 20]


def test_restart_budget_stops_a_crash_looping_image_from_thrashing() -> None:
    rules = policy(failureThreshold=1, restartBudget=2, restartWindowSeconds=600)
    memory = Memory()
    plan = decide([pod("a", DEAD)], memory, rules, [900.0, 950.0], 1000.0)
    assert plan.restart == []
    assert plan.budget_exhausted
    assert [a.pod for a in plan.held] == ["a"]
    # Once the old restarts leave the window, the watchdog acts again.
    later = decide([pod("a", DEAD)], memory, rules, [900.0, 950.0], 1600.0)
    assert [a.pod for a in later.restart] == ["a"]


def test_never_more_than_max_unavailable_pods_at_once() -> None:
    rules = policy(failureThreshold=1, maxUnavailable=1)
    pods = [pod("gone", DEAD, deleting=True), pod("b", DEAD)]
    plan = decide(pods, Memory(), rules, [], 0)
    assert plan.restart == []
    assert [a.pod for a in plan.held] == ["b"]


def test_a_pod_past_max_sessions_is_drained_then_deleted_once_empty() -> None:
    rules = policy(maxSessionsServed=100, maxUnavailable=1)
    memory = Memory()
    busy = Probe(None, active=3, served=150)
    first = decide([pod("old", busy), pod("new", HEALTHY)], memory, rules, [], 0)
    assert [(a.pod, a.reason) for a in first.drain] == [("old", Recycle.MAX_SESSIONS)]
    draining = Probe(None, active=3, served=150, draining=True)
    second = decide([pod("old", draining), pod("new", HEALTHY)], memory, rules, [], 5)
    assert second.drain == []
    assert second.recycle == []
    empty = Probe(None, active=0, served=150, draining=True)
    third = decide([pod("old", empty), pod("new", HEALTHY)], memory, rules, [], 10)
    assert [(a.pod, a.reason) for a in third.recycle] == [("old", Recycle.DRAINED)]


def test_a_drain_that_outlives_its_timeout_is_cut_short() -> None:
    rules = policy(maxAgeSeconds=3600, drainTimeoutSeconds=60)
    memory = Memory()
    busy = Probe(None, active=5, served=1)
    first = decide([pod("old", busy, age=4000)], memory, rules, [], 0)
    assert [a.reason for a in first.drain] == [Recycle.MAX_AGE]
    still = decide([pod("old", busy, age=4030)], memory, rules, [], 30)
    assert still.recycle == []
    late = decide([pod("old", busy, age=4061)], memory, rules, [], 61)
    assert [a.reason for a in late.recycle] == [Recycle.DRAIN_TIMEOUT]


def test_recycling_respects_max_unavailable() -> None:
    rules = policy(maxSessionsServed=10, maxUnavailable=1)
    worn = Probe(None, active=1, served=50)
    plan = decide([pod("a", worn), pod("b", worn), pod("c", worn)], Memory(), rules, [], 0)
    assert len(plan.drain) == 1


def status_body(**changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "env": "frozen_lake",
        "active": 1,
        "capacity": 16,
        "warm": 2,
        "warm_target": 2,
        "draining": False,
        "served": 7,
        "ready": True,
        "canary": {"ok": True, "latency_ms": 3.0, "at": 1000.0, "error": None},
    }
    body.update(changes)
    return body


def test_judge_reads_load_from_a_healthy_status() -> None:
    probe = judge(status_body(), policy(), now=1010.0)
    assert probe.failure is None
    assert (probe.active, probe.served) == (1, 7)


def test_judge_flags_a_failed_canary() -> None:
    canary = {"ok": False, "at": 1000.0, "error": "reset raised"}
    probe = judge(status_body(canary=canary), policy(), now=1010.0)
    assert probe.failure == Failure.CANARY_FAILED
    assert "reset raised" in probe.message


def test_judge_flags_a_server_whose_canary_stopped_running() -> None:
    rules = policy(canaryIntervalSeconds=60, canaryTimeoutSeconds=30, probePeriodSeconds=5)
    assert judge(status_body(), rules, now=1000.0 + 90).failure is None
    assert judge(status_body(), rules, now=1000.0 + 96).failure == Failure.STUCK
    # Warming up or draining pauses the canary: not stuck.
    assert judge(status_body(ready=False), rules, now=5000.0).failure is None
    assert judge(status_body(draining=True), rules, now=5000.0).failure is None


def test_judge_rejects_a_body_that_is_not_a_status() -> None:
    assert judge({"hello": "world"}, policy(), now=0).failure == Failure.BAD_STATUS
