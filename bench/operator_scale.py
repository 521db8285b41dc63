"""EnvPool operator at scale: 200 EnvPools on a real API server.

Starts a private control plane (etcd, kube-apiserver, kube-controller-manager; the integration
fixture's), installs the shipped CRD, runs `gymkube-operator` as a process, creates the pools as
fast as the API server takes them, and prints JSON: seconds until every pool has all five children
and a current status.observedGeneration, per-pool latency, and the operator's peak RSS.
Targets: all reconciled within 60 s, peak RSS at most 200 MB.

    .venv/bin/python bench/operator_scale.py [--pools 200] [--settle 15] [--operator PATH]

--operator runs another gymkube-operator executable, e.g. from a venv with only the operator's
runtime dependencies (as in its image): the dev venv also holds the official Kubernetes client,
which kopf imports whenever it is installed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import kubernetes
import psutil

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "tests" / "integration"))

from controlplane import ControlPlane, running_control_plane  # noqa: E402
from gymkube_operator.crds.catalog import package_file  # noqa: E402
from gymkube_operator.envpool.resource import ENVPOOL  # noqa: E402

GROUP, VERSION, PLURAL = "gymkube.io", "v1alpha1", "envpools"
NAMESPACE = "bench"
TARGET_SECONDS = 60.0
TARGET_RSS_MB = 200.0


class PeakRss:
    """Samples a process's resident memory every 50 ms and keeps the maximum."""

    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.05):
            try:
                self.peak = max(self.peak, self.process.memory_info().rss)
            except psutil.NoSuchProcess:
                return

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak / 2**20


def reconciled_pools(kube_client: kubernetes.client.ApiClient) -> set[str]:
    """Pools with a current observedGeneration whose five children all exist."""
    custom = kubernetes.client.CustomObjectsApi(kube_client)
    apps = kubernetes.client.AppsV1Api(kube_client)
    core = kubernetes.client.CoreV1Api(kube_client)
    policy = kubernetes.client.PolicyV1Api(kube_client)
    pools = custom.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL)["items"]
    current = {
        p["metadata"]["name"]
        for p in pools
        if p.get("status", {}).get("observedGeneration") == p["metadata"]["generation"]
    }
    statefulsets = {s.metadata.name for s in apps.list_namespaced_stateful_set(NAMESPACE).items}
    routers = {d.metadata.name for d in apps.list_namespaced_deployment(NAMESPACE).items}
    services = {s.metadata.name for s in core.list_namespaced_service(NAMESPACE).items}
    budgets = {
        b.metadata.name for b in policy.list_namespaced_pod_disruption_budget(NAMESPACE).items
    }
    return {
        name
        for name in current
        if name in statefulsets
        and f"{name}-router" in routers
        and {name, f"{name}-backends"} <= services
        and name in budgets
    }


def run_bench(
    kube: ControlPlane, operator_bin: Path, pools: int, settle: float, log_path: Path
) -> dict[str, Any]:
    kube.kubectl("apply", "--server-side", "-f", str(package_file(ENVPOOL)))
    kube.kubectl("wait", "--for=condition=Established", f"crd/{ENVPOOL.name}", "--timeout=60s")
    kube.kubectl("create", "namespace", NAMESPACE)
    env = kube.env()
    env.update(GYMKUBE_NAMESPACES=NAMESPACE, GYMKUBE_LIVENESS_PORT="0", GYMKUBE_METRICS_PORT="0")
    with log_path.open("wb") as log:
        operator = subprocess.Popen(
            [str(operator_bin)], env=env, stdout=log, stderr=subprocess.STDOUT
        )
    rss = PeakRss(operator.pid)
    try:
        with kube.api_client() as client:
            custom = kubernetes.client.CustomObjectsApi(client)
            names = [f"pool-{i:03d}" for i in range(pools)]
            started = time.monotonic()
            created_at: dict[str, float] = {}
            for name in names:
                body = {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": "EnvPool",
                    "metadata": {"name": name},
                    "spec": {"env": "frozen_lake", "replicas": 1},
                }
                custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, body)
                created_at[name] = time.monotonic() - started
            created_s = time.monotonic() - started
            first_seen: dict[str, float] = {}
            deadline = started + 10 * TARGET_SECONDS
            while len(first_seen) < pools and time.monotonic() < deadline:
                now = time.monotonic() - started
                for name in reconciled_pools(client) - first_seen.keys():
                    first_seen[name] = now
                time.sleep(0.25)
            total_s = max(first_seen.values()) if len(first_seen) == pools else None
            # Keep sampling while every pool's watchdog runs, to catch the steady-state peak.
            time.sleep(settle)
    finally:
        operator.terminate()
        operator.wait(timeout=60)
        peak_mb = rss.stop()
    # Each pool's own latency: from its create call returning to its first reconciled sighting.
    latencies = sorted(first_seen[n] - created_at[n] for n in first_seen)
    return {
        "pools": pools,
        "create_seconds": round(created_s, 2),
        "all_reconciled_seconds": None if total_s is None else round(total_s, 2),
        "reconciled": len(first_seen),
        "pool_latency_p50_seconds": round(statistics.median(latencies), 2) if latencies else None,
        "pool_latency_p95_seconds": round(latencies[int(0.95 * (len(latencies) - 1))], 2)
        if latencies
        else None,
        "operator_peak_rss_mb": round(peak_mb, 1),
        "settle_seconds": settle,
        "operator": str(operator_bin),
        "targets": {"all_reconciled_seconds": TARGET_SECONDS, "peak_rss_mb": TARGET_RSS_MB},
        "met": total_s is not None and total_s <= TARGET_SECONDS and peak_mb <= TARGET_RSS_MB,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pools", type=int, default=200)
    parser.add_argument("--settle", type=float, default=15.0, help="seconds of steady state")
    parser.add_argument(
        "--operator",
        type=Path,
        default=Path(sys.executable).parent / "gymkube-operator",
        help="the gymkube-operator executable to run",
    )
    options = parser.parse_args()
    with running_control_plane() as kube:
        log_path = kube.workdir / "operator.log"
        result = run_bench(kube, options.operator, options.pools, options.settle, log_path)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
