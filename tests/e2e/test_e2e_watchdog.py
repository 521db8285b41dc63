"""The watchdog on a real cluster: a frozen (SIGSTOP) or killed env server is replaced, the pool
records why, and sessions on the other pod play on undisturbed."""

import json
import time
from typing import Any

import pytest
from e2e_cluster import (
    ENVSERVER_PORT,
    Cluster,
    E2ESettings,
    api_path,
    envpool_manifest,
    envserver_selector,
    gymkube_path,
    wait_until,
)

# Waits inside the tests have their own deadlines; this only bounds a test that hangs outright.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

PROBE_PERIOD_S = 2
FAILURE_THRESHOLD = 3
MOVES = ("right", "down", "right", "down", "left", "up")


def _play_episode(operator: Cluster, namespace: str, pod: str) -> dict[str, Any]:
    """Plays one whole FrozenLake episode on POD directly; returns the last step's answer."""
    code, created = operator.pod_http(namespace, pod, ENVSERVER_PORT, "/create", {})
    assert code == 200, f"/create on {pod}: {code} {created}"
    session = created["id"]
    code, reset = operator.pod_http(
        namespace, pod, ENVSERVER_PORT, "/reset", {"id": session, "seed": 7}
    )
    assert code == 200, f"/reset on {pod}: {code} {reset}"
    step: dict[str, Any] = reset
    for turn in range(100):
        if step.get("done"):
            break
        action = f"<action>{MOVES[turn % len(MOVES)]}</action>"
        code, step = operator.pod_http(
            namespace, pod, ENVSERVER_PORT, "/step", {"id": session, "action": action}
        )
        assert code == 200, f"/step on {pod}: {code} {step}"
    assert step.get("done"), f"episode on {pod} did not finish: {step}"
    operator.pod_http(namespace, pod, ENVSERVER_PORT, "/close", {"id": session})
    return step


def _terminations(pod: dict[str, Any]) -> list[dict[str, Any]]:
    """The last termination of each restarted container (exit code, reason)."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return [
        s["lastState"]["terminated"]
        for s in statuses
        if s.get("restartCount", 0) > 0 and "terminated" in (s.get("lastState") or {})
    ]


def _start_pool(operator: Cluster, namespace: str) -> tuple[str, str]:
    watchdog = {
        "probePeriodSeconds": PROBE_PERIOD_S,
        "probeTimeoutSeconds": 1,
        "failureThreshold": FAILURE_THRESHOLD,
        "canaryIntervalSeconds": 0,
    }
    manifest = envpool_manifest("lake", "frozen_lake", 2, watchdog=watchdog)
    operator.create(gymkube_path("envpools", namespace), manifest)
    operator.wait_pool_ready(namespace, "lake")
    victim, survivor = (
        str(p["metadata"]["name"]) for p in operator.pods(namespace, envserver_selector("lake"))
    )
    return victim, survivor


def _uid(operator: Cluster, namespace: str, pod: str) -> str:
    found = operator.get(api_path("v1", "pods", namespace, pod))
    assert found is not None, f"pod {pod} is gone"
    return str(found["metadata"]["uid"])


def _replaced(operator: Cluster, namespace: str, pod: str, old_uid: str) -> bool:
    current = operator.pod_ready(namespace, pod)
    return current is not None and current["metadata"]["uid"] != old_uid


def _restarts(operator: Cluster, namespace: str) -> dict[str, Any]:
    pool = operator.get(gymkube_path("envpools", namespace, "lake")) or {}
    restarts: dict[str, Any] = (pool.get("status") or {}).get("restarts") or {}
    return restarts


def test_watchdog_replaces_a_frozen_server(
    operator: Cluster, settings: E2ESettings, namespace: str
) -> None:
    victim, survivor = _start_pool(operator, namespace)
    old_uid = _uid(operator, namespace, victim)

    operator.signal_envserver(namespace, victim, "SIGSTOP")
    frozen_at = time.monotonic()
    # The other pod's sessions play whole episodes while the watchdog deals with the frozen one.
    _play_episode(operator, namespace, survivor)

    def restart_recorded() -> dict[str, Any] | None:
        restarts = _restarts(operator, namespace)
        return restarts if restarts.get("lastPod") == victim else None

    detect_budget = FAILURE_THRESHOLD * PROBE_PERIOD_S + 30
    restarts = wait_until(
        restart_recorded, timeout=detect_budget, what=f"the watchdog to restart {victim}"
    )
    detected_s = time.monotonic() - frozen_at
    print(json.dumps({"watchdog_detect_s": round(detected_s, 1)}))
    assert restarts["count"] >= 1
    assert restarts["lastReason"] == "NoAnswer"
    assert any(r["pod"] == victim and r["reason"] == "NoAnswer" for r in restarts["recent"])

    wait_until(
        lambda: _replaced(operator, namespace, victim, old_uid),
        timeout=settings.pod_start_timeout_s,
        what=f"a new {victim} to be Ready",
    )
    replaced_s = time.monotonic() - frozen_at
    print(json.dumps({"watchdog_freeze_to_replaced_s": round(replaced_s, 1)}))
    assert replaced_s <= FAILURE_THRESHOLD * PROBE_PERIOD_S + settings.pod_start_timeout_s

    operator.wait_pool_ready(namespace, "lake", extra=lambda p: p["status"]["readyReplicas"] == 2)
    _play_episode(operator, namespace, survivor)
    _play_episode(operator, namespace, victim)


def test_a_killed_server_is_brought_back_and_the_cause_recorded(
    operator: Cluster, settings: E2ESettings, namespace: str
) -> None:
    victim, survivor = _start_pool(operator, namespace)
    old_uid = _uid(operator, namespace, victim)

    operator.signal_envserver(namespace, victim, "SIGKILL")
    _play_episode(operator, namespace, survivor)

    def recovered() -> str | None:
        pod = operator.pod_ready(namespace, victim)
        if pod is None:
            return None
        if pod["metadata"]["uid"] != old_uid:
            return "replaced"
        # The kubelet may restart the container before the watchdog's threshold is reached.
        if _terminations(pod):
            return "restarted"
        return None

    how = wait_until(
        recovered,
        timeout=FAILURE_THRESHOLD * PROBE_PERIOD_S + settings.pod_start_timeout_s,
        what=f"{victim} to serve again",
    )
    pool = operator.wait_pool_ready(
        namespace, "lake", extra=lambda p: p["status"]["readyReplicas"] == 2
    )
    restarts = pool["status"].get("restarts") or {}
    if how == "replaced":
        assert any(r["pod"] == victim for r in restarts.get("recent", [])), restarts
    else:
        # tini exits as its child did: 128 + SIGKILL.
        pod = operator.get(api_path("v1", "pods", namespace, victim))
        assert pod is not None
        assert [t.get("exitCode") for t in _terminations(pod)] == [137], _terminations(pod)
    _play_episode(operator, namespace, victim)
