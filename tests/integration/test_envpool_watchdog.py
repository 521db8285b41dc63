"""The watchdog against real env-server processes standing in for a pool's pods.

The test control plane runs no kubelet, so the StatefulSet's pods exist but never run. The operator
runs in-process with an address resolver that points each pod at a local gymkube-envserver: one
healthy, one hung (SIGSTOP), one killed.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from controlplane import ControlPlane
from gymkube_operator.main import run
from gymkube_operator.settings import OperatorSettings
from operator_support import Cluster, EnvServer, envpool, eventually, install_crds

pytestmark = pytest.mark.integration

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
def servers(tmp_path: Path) -> Iterator[list[EnvServer]]:
    started = [EnvServer(tmp_path / f"envserver-{i}.log") for i in range(3)]
    try:
        eventually("env servers up", lambda: True if all(s.status() for s in started) else None)
        yield started
    finally:
        for server in started:
            server.stop()


@pytest.fixture
def cluster(kube: ControlPlane, namespace: str) -> Iterator[Cluster]:
    install_crds(kube)
    with kube.api_client() as client:
        yield Cluster(client, namespace)


def in_process_operator(
    kube: ControlPlane, namespace: str, addresses: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> tuple[threading.Thread, threading.Event]:
    monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig))
    settings = OperatorSettings(namespaces=[namespace], liveness_port=0)

    def resolve(pod: dict[str, Any], port: int) -> str | None:
        return addresses.get(pod["metadata"]["name"])

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
    addresses = {"wd-0": healthy.url, "wd-1": hung.url, "wd-2": dead.url}
    thread, stop = in_process_operator(kube, cluster.namespace, addresses, monkeypatch)
    try:
        cluster.create(envpool("wd", replicas=3, watchdog=POLICY))
        pod = eventually(
            "pod wd-0",
            lambda: next(
                (
                    p
                    for p in cluster.core.list_namespaced_pod(cluster.namespace).items
                    if p.metadata.name == "wd-0"
                ),
                None,
            ),
        )
        healthy_uid = pod.metadata.uid

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
