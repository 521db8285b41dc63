"""Helpers for the EnvPool integration tests: CRDs, the operator process, env servers, waits."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import kubernetes
import pytest
from controlplane import ControlPlane
from gymkube_dev.ports import free_port
from gymkube_operator.crds.catalog import RESOURCES, package_file
from prometheus_client.parser import text_string_to_metric_families

T = TypeVar("T")
GROUP, VERSION, PLURAL = "gymkube.io", "v1alpha1", "envpools"
BIN_DIR = Path(sys.executable).parent
WAIT_S = 60.0
# Pods bound here are "on a node" for the API server; no kubelet ever runs them.
FAKE_NODE = "gymkube-test-node"


def eventually(what: str, probe: Callable[[], T | None], timeout: float = WAIT_S) -> T:
    """Poll probe until it returns something other than None (or fail saying what was awaited)."""
    deadline = time.monotonic() + timeout
    while (result := probe()) is None:
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.2)
    return result


def install_crds(kube: ControlPlane) -> None:
    """Install every CRD exactly as shipped, before any operator starts (the operator watches
    them all, and the examples name them all)."""
    for resource in RESOURCES:
        kube.kubectl("apply", "--server-side", "-f", str(package_file(resource)))
    wait_for_crds(kube)


def wait_for_crds(kube: ControlPlane) -> None:
    """Until every gymkube CRD is established (after they were applied, from wherever)."""
    names = [f"crd/{resource.name}" for resource in RESOURCES]
    kube.kubectl("wait", "--for=condition=Established", *names, "--timeout=60s")


def envpool(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "EnvPool",
        "metadata": {"name": name},
        "spec": {"env": "frozen_lake", **spec},
    }


class Cluster:
    """Typed reads and writes the tests need, through one API client."""

    def __init__(self, client: kubernetes.client.ApiClient, namespace: str) -> None:
        self.namespace = namespace
        self.custom = kubernetes.client.CustomObjectsApi(client)
        self.apps = kubernetes.client.AppsV1Api(client)
        self.core = kubernetes.client.CoreV1Api(client)
        self.policy = kubernetes.client.PolicyV1Api(client)

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        created: dict[str, Any] = self.custom.create_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, body
        )
        return created

    def get(self, name: str) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = self.custom.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, name
            )
        except kubernetes.client.ApiException as error:
            if error.status == 404:
                return None
            raise
        return found

    def patch(self, name: str, spec: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, name, {"spec": spec}
        )

    def reconciled(self, name: str, generation: int | None = None) -> dict[str, Any] | None:
        """The pool once the operator has acted on its current (or the given) generation."""
        pool = self.get(name)
        if pool is None:
            return None
        wanted = generation or pool["metadata"]["generation"]
        if pool.get("status", {}).get("observedGeneration") != wanted:
            return None
        return pool

    def children(self, pool: str) -> dict[tuple[str, str], Any]:
        """Every object in the namespace labelled as belonging to the pool, by (kind, name)."""
        selector = f"gymkube.io/envpool={pool}"
        ns = self.namespace
        found: dict[tuple[str, str], Any] = {}
        for kind, items in (
            ("StatefulSet", self.apps.list_namespaced_stateful_set(ns, label_selector=selector)),
            ("Deployment", self.apps.list_namespaced_deployment(ns, label_selector=selector)),
            ("Service", self.core.list_namespaced_service(ns, label_selector=selector)),
            (
                "PodDisruptionBudget",
                self.policy.list_namespaced_pod_disruption_budget(ns, label_selector=selector),
            ),
        ):
            for item in items.items:
                key = (kind, item.metadata.name)
                assert key not in found, f"duplicate {key}"
                found[key] = item
        return found

    def events(self, pool: str) -> list[Any]:
        selector = f"involvedObject.name={pool},involvedObject.kind=EnvPool"
        items: list[Any] = self.core.list_namespaced_event(
            self.namespace, field_selector=selector
        ).items
        return items

    def bind_pods(self, selector: str, node: str = FAKE_NODE) -> int:
        """Do what a scheduler would: bind the pods to NODE (a Node object with no kubelet), so the
        API server deletes them gracefully, as on a real node: they stay, marked with their
        deletion grace period, until deleted with grace 0. Returns how many pods are bound."""
        try:
            self.core.create_node({"metadata": {"name": node}})
        except kubernetes.client.ApiException as error:
            if error.status != 409:
                raise
        pods = self.core.list_namespaced_pod(self.namespace, label_selector=selector).items
        for pod in (p for p in pods if not p.spec.node_name):
            binding = {
                "metadata": {"name": pod.metadata.name},
                "target": {"kind": "Node", "name": node},
            }
            # The client cannot parse the binding's reply (a Status); it is not needed.
            self.core.create_namespaced_pod_binding(
                pod.metadata.name, self.namespace, binding, _preload_content=False
            )
        return len(pods)

    def mark_pods_ready(self, selector: str) -> int:
        """Do what a kubelet would: report the pods running and ready (without a pod IP, so the
        watchdog leaves them alone). Returns how many pods were marked."""
        pods = self.core.list_namespaced_pod(self.namespace, label_selector=selector).items
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        for pod in pods:
            status = {
                "phase": "Running",
                "conditions": [
                    {"type": "Ready", "status": "True", "lastTransitionTime": now},
                    {"type": "ContainersReady", "status": "True", "lastTransitionTime": now},
                ],
            }
            self.core.patch_namespaced_pod_status(
                pod.metadata.name, self.namespace, {"status": status}
            )
        return len(pods)

    def report_container(self, pod: str, container: dict[str, Any]) -> None:
        """Do what a kubelet would: report the env-server container's state (running, waiting,
        restarted, with its termination message) on a pod of the pool."""
        spec = self.core.read_namespaced_pod(pod, self.namespace).spec.containers[0]
        status = {
            "phase": "Running",
            "containerStatuses": [
                {
                    "name": spec.name,
                    "image": spec.image,
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    **container,
                }
            ],
        }
        self.core.patch_namespaced_pod_status(pod, self.namespace, {"status": status})


class OperatorProcess:
    """`gymkube-operator` as users run it, watching one namespace, its log in a file."""

    def __init__(self, kube: ControlPlane, namespace: str, log_path: Path) -> None:
        self.log_path = log_path
        self.metrics_port = free_port()
        env = kube.env()
        env.update(
            GYMKUBE_NAMESPACES=namespace,
            GYMKUBE_LIVENESS_PORT="0",
            GYMKUBE_METRICS_PORT=str(self.metrics_port),
        )
        with log_path.open("ab") as log:
            self.popen = subprocess.Popen(
                [str(BIN_DIR / "gymkube-operator")],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Its /metrics as {(sample name, sorted labels): value}."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }

    def kill(self) -> None:
        """SIGKILL: no cleanup at all, as when a node dies under the operator."""
        self.popen.send_signal(signal.SIGKILL)
        self.popen.wait()

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


@contextlib.contextmanager
def running_operator(
    kube: ControlPlane, cluster: Cluster, log_path: Path
) -> Iterator[OperatorProcess]:
    operator = OperatorProcess(kube, cluster.namespace, log_path)
    try:
        yield operator
        # Let the operator release its finalizers so the namespace can go away after the test.
        for pool in cluster.custom.list_namespaced_custom_object(
            GROUP, VERSION, cluster.namespace, PLURAL
        )["items"]:
            cluster.custom.delete_namespaced_custom_object(
                GROUP, VERSION, cluster.namespace, PLURAL, pool["metadata"]["name"]
            )
        eventually(
            "pools deleted",
            lambda: (
                True
                if not cluster.custom.list_namespaced_custom_object(
                    GROUP, VERSION, cluster.namespace, PLURAL
                )["items"]
                else None
            ),
        )
    finally:
        operator.stop()
        print(f"--- operator log ({log_path}) ---\n{operator.log_tail()}")


class EnvServer:
    """A real gymkube-envserver process standing in for an env-server pod."""

    def __init__(self, log_path: Path) -> None:
        self.port, self.admin_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.admin_url = f"http://127.0.0.1:{self.admin_port}"
        with log_path.open("ab") as log:
            self.popen = subprocess.Popen(
                [
                    str(BIN_DIR / "gymkube-envserver"),
                    *("--env", "frozen_lake", "--host", "127.0.0.1", "--port", str(self.port)),
                    *("--admin-port", str(self.admin_port)),
                    *("--max-sessions", "4", "--warm", "1", "--canary-interval", "1"),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, "HOME": str(log_path.parent)},
            )

    def status(self) -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(f"{self.url}/status", timeout=2) as response:
                body: dict[str, Any] = json.load(response)
                return body
        except OSError:
            return None

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(
            f"{self.url}{path}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            answer: dict[str, Any] = json.load(response)
            return answer

    def pause(self) -> None:
        self.popen.send_signal(signal.SIGSTOP)

    def kill(self) -> None:
        self.popen.kill()
        self.popen.wait()

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGCONT)
            self.popen.kill()
            self.popen.wait()
