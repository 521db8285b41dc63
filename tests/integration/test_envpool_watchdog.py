"""The watchdog and the drain hook against real env-server processes standing in for pods.

The test control plane runs no kubelet, so the StatefulSet's pods exist but never run. The operator
runs in-process with an address resolver that points each pod at a local gymkube-envserver: one
healthy, one hung (SIGSTOP), one killed.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from controlplane import ControlPlane
from gymkube_operator.envpool.builders import build_statefulset, owner
from gymkube_operator.envpool.models import EnvPoolSpec
from gymkube_operator.main import run
from gymkube_operator.settings import OperatorSettings
from operator_support import Cluster, EnvServer, envpool, eventually

pytestmark = pytest.mark.integration

POOL_DEFAULTS = EnvPoolSpec(env="frozen_lake")
POLICY = {
    "probePeriodSeconds": 2,
    "probeTimeoutSeconds": 1,
    "failureThreshold": 2,
    "maxUnavailable": 3,
    "restartBudget": 3,
    "restartWindowSeconds": 600,
    "canaryIntervalSeconds": 0,
}


@pytest.fixture
def servers(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[list[EnvServer]]:
    count = getattr(request, "param", 3)
    started = [EnvServer(tmp_path / f"envserver-{i}.log") for i in range(count)]
    try:
        eventually("env servers up", lambda: True if all(s.status() for s in started) else None)
        yield started
    finally:
        for server in started:
            server.stop()


def pod_uid(cluster: Cluster, name: str) -> str | None:
    for pod in cluster.core.list_namespaced_pod(cluster.namespace).items:
        if pod.metadata.name == name and not pod.metadata.deletion_timestamp:
            uid: str = pod.metadata.uid
            return uid
    return None


def in_process_operator(
    kube: ControlPlane,
    namespace: str,
    servers: dict[str, EnvServer],
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[threading.Thread, threading.Event]:
    monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig))
    settings = OperatorSettings(namespaces=[namespace], liveness_port=0, metrics_port=0)

    def resolve(pod: dict[str, Any], port: int) -> str | None:
        # The operator asks for a pod's address on the pool's port or its admin port.
        server = servers.get(pod["metadata"]["name"])
        if server is None:
            return None
        return server.admin_url if port == POOL_DEFAULTS.admin_port else server.url

    stop, ready = threading.Event(), threading.Event()
    thread = threading.Thread(
        target=lambda: asyncio.run(
            run(settings, resolve=resolve, stop_flag=stop, ready_flag=ready)
        ),
        daemon=True,
    )
    thread.start()
    assert ready.wait(30), "operator did not start"
    return thread, stop


def test_watchdog_restarts_hung_and_dead_servers_within_its_budget(
    kube: ControlPlane,
    cluster: Cluster,
    servers: list[EnvServer],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    healthy, hung, dead = servers
    hung.pause()
    dead.kill()
    pods = {"wd-0": healthy, "wd-1": hung, "wd-2": dead}
    thread, stop = in_process_operator(kube, cluster.namespace, pods, monkeypatch)
    try:
        cluster.create(envpool("wd", replicas=3, watchdog=POLICY))
        healthy_uid = eventually("pod wd-0", lambda: pod_uid(cluster, "wd-0"))

        def budget_spent() -> dict[str, Any] | None:
            status = (cluster.get("wd") or {}).get("status", {})
            degraded = [c for c in status.get("conditions", []) if c["type"] == "Degraded"]
            spent = degraded and degraded[0]["reason"] == "RestartBudgetExhausted"
            return status if spent else None

        status = eventually("restart budget spent", budget_spent, timeout=90)
        restarts = status["restarts"]
        assert restarts["count"] == 3
        assert {r["pod"] for r in restarts["recent"]} == {"wd-1", "wd-2"}
        assert {r["reason"] for r in restarts["recent"]} == {"NoAnswer"}
        assert restarts["lastPod"] in {"wd-1", "wd-2"}
        assert restarts["lastTime"]

        # Past the budget the watchdog holds off: no fourth restart over several periods.
        time.sleep(3 * POLICY["probePeriodSeconds"])
        assert (cluster.get("wd") or {})["status"]["restarts"]["count"] == 3

        # The healthy server's pod was never touched, and users see why the others were.
        survivor = cluster.core.read_namespaced_pod("wd-0", cluster.namespace)
        assert survivor.metadata.uid == healthy_uid
        eventually(
            "a RestartBudgetExhausted event",
            lambda: (
                True
                if any(e.reason == "RestartBudgetExhausted" for e in cluster.events("wd"))
                else None
            ),
        )
        restarted = [e for e in cluster.events("wd") if e.reason == "PodRestarted"]
        assert restarted
        assert all(e.type == "Warning" for e in restarted)
        assert any("wd-1" in e.message for e in restarted)
        assert any("wd-2" in e.message for e in restarted)
    finally:
        cluster.custom.delete_namespaced_custom_object(
            "gymkube.io", "v1alpha1", cluster.namespace, "envpools", "wd"
        )
        eventually("pool deleted", lambda: True if cluster.get("wd") is None else None)
        stop.set()
        thread.join(30)


@pytest.mark.parametrize("servers", [1], indirect=True)
def test_a_worn_out_server_is_drained_and_recycled_only_once_its_sessions_end(
    kube: ControlPlane,
    cluster: Cluster,
    servers: list[EnvServer],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (server,) = servers
    policy = {**POLICY, "maxSessionsServed": 2, "drainTimeoutSeconds": 600}
    thread, stop = in_process_operator(kube, cluster.namespace, {"rec-0": server}, monkeypatch)
    try:
        cluster.create(envpool("rec", replicas=1, watchdog=policy))
        first_uid = eventually("pod rec-0", lambda: pod_uid(cluster, "rec-0"))
        finished = server.post("/create", {})["id"]
        server.post("/close", {"id": finished})
        live = server.post("/create", {})["id"]  # the second session served, still open

        eventually(
            "the server drained",
            lambda: True if (server.status() or {}).get("draining") else None,
        )
        # A live session keeps its server: no deletion while it runs.
        time.sleep(3 * POLICY["probePeriodSeconds"])
        assert pod_uid(cluster, "rec-0") == first_uid

        server.post("/close", {"id": live})
        eventually(
            "pod recycled",
            lambda: True if pod_uid(cluster, "rec-0") not in (None, first_uid) else None,
        )
        status = eventually(
            "recycle recorded",
            lambda: (
                (cluster.get("rec") or {}).get("status", {}).get("restarts", {}).get("recycled")
                or None
            ),
        )
        assert status >= 1
        reasons = [e.reason for e in cluster.events("rec")]
        assert "PodDraining" in reasons
        assert "PodRecycled" in reasons
        assert "PodRestarted" not in reasons
    finally:
        cluster.custom.delete_namespaced_custom_object(
            "gymkube.io", "v1alpha1", cluster.namespace, "envpools", "rec"
        )
        eventually("pool deleted", lambda: True if cluster.get("rec") is None else None)
        stop.set()
        thread.join(30)


@pytest.mark.parametrize("servers", [1], indirect=True)
def test_the_prestop_hook_drains_and_waits_for_live_sessions(servers: list[EnvServer]) -> None:
    """What the kubelet runs before stopping an env server in a rollout or scale-down."""
    (server,) = servers
    live = server.post("/create", {})["id"]
    spec = EnvPoolSpec(env="frozen_lake", port=server.port, admin_port=server.admin_port)
    pod = build_statefulset(owner("p", "ns", "uid"), spec, OperatorSettings())
    hook = pod["spec"]["template"]["spec"]["containers"][0]["lifecycle"]["preStop"]["exec"]
    command = [sys.executable, *hook["command"][1:]]
    with subprocess.Popen(command) as pre_stop:
        eventually("draining", lambda: True if (server.status() or {}).get("draining") else None)
        time.sleep(2)
        assert pre_stop.poll() is None, "the hook returned while a session was live"
        server.post("/close", {"id": live})
        assert pre_stop.wait(timeout=10) == 0
