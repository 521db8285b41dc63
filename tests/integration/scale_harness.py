"""Fake nodes and pods on the integration control plane, for scale tests: kube-scheduler places
pods on nodes that only kwok (sigs.k8s.io/kwok, built by hack/build-tools.sh) pretends to run.

kwok marks each scheduled pod Running, started and Ready with a pod IP (nothing listens on it:
the watchdog is pointed at bench/scale_farm.py with settings.probe_address_template), keeps the
nodes' leases fresh so the node lifecycle controller never evicts, and finishes pod deletions
as a kubelet would.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

from controlplane import ControlPlane, ControlPlaneError, _Process

NODE_ANNOTATION = "kwok.x-k8s.io/node"
# The API clients of the scheduler and kwok must not be the bottleneck of a 10,000-pod run.
SCHEDULER_QPS = 1000
# Every extra flag the control plane needs for 10,000 pods: the controller-manager makes the
# StatefulSet and ReplicaSet pods, so its client limit and sync workers bound the ramp.
CONTROLLER_MANAGER_SCALE_ARGS = (
    "--kube-api-qps=1000",
    "--kube-api-burst=2000",
    "--concurrent-statefulset-syncs=20",
    "--concurrent-replicaset-syncs=20",
    # Each pool's router is a Deployment: with the default 5 workers its status lagged its pod by
    # minutes at 1,000 pools, and the pools waited on "no session router is ready".
    "--concurrent-deployment-syncs=20",
    # A starved kwok renews its nodes' leases late; a node marked unreachable would mark every
    # pod on it not Ready (and evict them), which no real kubelet outage is being measured for.
    "--node-monitor-grace-period=10m",
)

# kwok's configuration: enough workers that thousands of pods turn Running in seconds (4 each
# by default, which holds a 10,000-pod ramp to about 10 pods/s), then its behaviour as Stage
# objects (kwok.x-k8s.io/v1alpha1): a node turns Ready; a scheduled pod that is not Ready turns
# Running with every container started and ready; a deleted pod goes.
KWOK_CONFIG = """
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
options:
  podPlayStageParallelism: 64
  nodePlayStageParallelism: 8
  nodeLeaseParallelism: 8
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata: {name: gymkube-node-ready}
spec:
  resourceRef: {apiGroup: v1, kind: Node}
  selector:
    matchExpressions:
    - {key: '.status.conditions.[] | select( .type == "Ready" ) | .status',
       operator: NotIn, values: ['True']}
  next:
    statusTemplate: |
      conditions:
      - type: Ready
        status: "True"
        reason: KubeletReady
        message: kwok pretends to be this node's kubelet
        lastHeartbeatTime: {{ Now | Quote }}
        lastTransitionTime: {{ Now | Quote }}
      addresses:
      - {type: InternalIP, address: {{ NodeIP | Quote }}}
      - {type: Hostname, address: {{ NodeName | Quote }}}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata: {name: gymkube-pod-running}
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - {key: '.metadata.deletionTimestamp', operator: DoesNotExist}
    - {key: '.status.conditions.[] | select( .type == "Ready" ) | .status',
       operator: NotIn, values: ['True']}
  next:
    statusTemplate: |
      {{ $now := Now }}
      phase: Running
      startTime: {{ $now | Quote }}
      conditions:
      {{ range list "Initialized" "Ready" "ContainersReady" "PodScheduled" }}
      - {type: {{ . }}, status: "True", lastTransitionTime: {{ $now | Quote }}}
      {{ end }}
      initContainerStatuses:
      {{ range .spec.initContainers }}
      - name: {{ .name | Quote }}
        image: {{ .image | Quote }}
        ready: true
        restartCount: 0
        state: {terminated: {exitCode: 0, reason: Completed, startedAt: {{ $now | Quote }},
                finishedAt: {{ $now | Quote }}}}
      {{ end }}
      containerStatuses:
      {{ range .spec.containers }}
      - name: {{ .name | Quote }}
        image: {{ .image | Quote }}
        ready: true
        started: true
        restartCount: 0
        state: {running: {startedAt: {{ $now | Quote }}}}
      {{ end }}
      {{ with PodIPWith .spec.nodeName false .metadata.uid .metadata.name .metadata.namespace }}
      podIP: {{ . | Quote }}
      podIPs: [{ip: {{ . | Quote }}}]
      {{ end }}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata: {name: gymkube-pod-delete}
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - {key: '.metadata.deletionTimestamp', operator: Exists}
  next:
    delete: true
"""


def fake_node(name: str, pods: int) -> dict[str, object]:
    """A Node kwok manages, roomy enough that only its pod count limits what it takes."""
    capacity = {"cpu": "1000", "memory": "4Ti", "pods": str(pods)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {NODE_ANNOTATION: "fake"},
            "labels": {"type": "kwok", "kubernetes.io/hostname": name},
        },
        "status": {"capacity": capacity, "allocatable": capacity},
    }


def _require(bin_dir: Path, *names: str) -> None:
    missing = [name for name in names if not (bin_dir / name).is_file()]
    if missing:
        raise ControlPlaneError(
            f"{', '.join(missing)} not found in {bin_dir}; build them with `make tools`"
        )


@contextlib.contextmanager
def running_kwok(kube: ControlPlane, nodes: int, pods_per_node: int = 1000) -> Iterator[None]:
    """kube-scheduler and kwok against kube, with `nodes` fake nodes; stopped on exit."""
    _require(kube.bin_dir, "kube-scheduler", "kwok")
    logs = kube.workdir / "logs"
    config = kube.workdir / "kwok.yaml"
    config.write_text(KWOK_CONFIG)
    scheduler = _Process(
        "kube-scheduler",
        [
            str(kube.bin_dir / "kube-scheduler"),
            f"--kubeconfig={kube.kubeconfig}",
            "--leader-elect=false",
            "--secure-port=0",
            f"--kube-api-qps={SCHEDULER_QPS}",
            f"--kube-api-burst={2 * SCHEDULER_QPS}",
        ],
        logs / "kube-scheduler.log",
    )
    kwok = _Process(
        "kwok",
        [
            str(kube.bin_dir / "kwok"),
            f"--kubeconfig={kube.kubeconfig}",
            f"--config={config}",
            f"--manage-nodes-with-annotation-selector={NODE_ANNOTATION}=fake",
            "--node-lease-duration-seconds=40",
            "--cidr=10.128.0.0/10",
        ],
        logs / "kwok.log",
    )
    try:
        items = [fake_node(f"kwok-node-{i:03d}", pods_per_node) for i in range(nodes)]
        kube.kubectl(
            "apply",
            "-f",
            "-",
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}),
        )
        kube.kubectl("wait", "--for=condition=Ready", "nodes", "--all", "--timeout=60s")
        scheduler.check_running()
        kwok.check_running()
        yield
    finally:
        kwok.stop()
        scheduler.stop()
