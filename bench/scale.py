"""EnvPool operator at scale: 100 and 1,000 pools of 10 env servers each, watchdog included.

For each size, on a fresh private control plane (the integration fixture's, plus kube-scheduler
and kwok from tests/integration/scale_harness.py: fake nodes, pods marked Running and Ready),
runs `gymkube-operator` as a process whose watchdog probes bench/scale_farm.py (one loopback
process answering /status for every pod, via settings.probe_address_template). Prints JSON:

- seconds from applying all pools to all Ready (progress on stderr), the CPU-seconds the control
  plane and the operator spent meanwhile (and the shortest ramp those allow on this machine's
  cores), when the operator applied its last child and how long its applies took;
- operator RSS (peak and steady) and CPU at steady state;
- watchdog probes/s the farm answered vs pods / probePeriodSeconds;
- API requests/s the operator makes at steady state, and its status writes/s (counted from the
  API server's audit log of the operator's own user);
- seconds to detect (delete) and replace a frozen pod, against failureThreshold x period + 5 s.

    .venv/bin/python bench/scale.py [--pools 100 1000] [--replicas 10] [--steady 30]
                                    [--set GYMKUBE_APPLY_CONCURRENCY=24 ...]

Every process shares this machine's CPUs (the API server, etcd, kwok, the farm and the
operator): the JSON records the load average so a run on a busy machine reads as one.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes
import kubernetes.watch
import psutil
from gymkube_dev.processes import stop

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "tests" / "integration"))

from controlplane import ControlPlane, running_control_plane  # noqa: E402
from gymkube_operator.crds.catalog import package_file  # noqa: E402
from gymkube_operator.envpool.models import WatchdogSpec  # noqa: E402
from gymkube_operator.envpool.resource import ENVPOOL  # noqa: E402
from measure import cpu_seconds, percentile  # noqa: E402
from operator_scale import PeakRss  # noqa: E402
from scale_harness import CONTROLLER_MANAGER_SCALE_ARGS, running_kwok  # noqa: E402

GROUP, VERSION, PLURAL = "gymkube.io", "v1alpha1", "envpools"
NAMESPACE = "bench"
OPERATOR_USER = "gymkube-bench-operator"
PODS_PER_NODE = 1000
# On a busy 2-core machine 1,000 pools take many minutes: steady state is measured only after.
READY_TIMEOUT_SECONDS = 1800.0
PROGRESS_SECONDS = 15.0
CONTROL_PLANE_PROCESSES = {
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kwok",
}
CPUS = os.cpu_count() or 1
# A ClusterIP for each pool's Service: the integration fixture's /24 holds 254.
SERVICE_CIDR = "10.0.0.0/16"
WATCHDOG = WatchdogSpec()
TARGETS = {
    "all_ready_seconds_1000_pools": 120.0,
    "operator_rss_mb": 500.0,
    "frozen_detect_slack_seconds": 5.0,
    "steady_status_writes_per_second": 0.0,
}
# The operator's own requests, nobody else's; watches are counted when they end.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived", "ResponseStarted"],
    "rules": [{"level": "Metadata", "users": [OPERATOR_USER]}, {"level": "None"}],
}


def pool_body(name: str, replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "EnvPool",
        "metadata": {"name": name},
        "spec": {
            "env": "frozen_lake",
            "replicas": replicas,
            "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
            "router": {"replicas": 1},
        },
    }


@contextlib.contextmanager
def running_farm() -> Iterator[str]:
    """bench/scale_farm.py as a process; yields its base URL."""
    farm = subprocess.Popen(
        [sys.executable, str(REPO_ROOT / "bench" / "scale_farm.py")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert farm.stdout is not None
        port = json.loads(farm.stdout.readline())["port"]
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(farm)


def farm_call(farm: str, path: str, body: dict[str, str] | None = None) -> dict[str, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{farm}{path}", data=data, method="POST" if data else "GET")
    with urllib.request.urlopen(request, timeout=10) as response:
        answer: dict[str, Any] = json.loads(response.read())
        return answer


@contextlib.contextmanager
def running_operator(
    kube: ControlPlane, farm: str, operator_bin: Path, log_path: Path, settings: dict[str, str]
) -> Iterator[psutil.Process]:
    """gymkube-operator as its own API user (so the audit log tells its requests apart)."""
    env = kube.env()
    env.update(
        KUBECONFIG=str(kube.kubeconfig_for_user(OPERATOR_USER, groups=["system:masters"])),
        GYMKUBE_NAMESPACES=NAMESPACE,
        GYMKUBE_LIVENESS_PORT="0",
        GYMKUBE_METRICS_PORT="0",
        GYMKUBE_PROBE_ADDRESS_TEMPLATE=f"{farm}/{{namespace}}/{{name}}/{{uid}}",
        **settings,
    )
    with log_path.open("wb") as log:
        operator = subprocess.Popen(
            [str(operator_bin)], env=env, stdout=log, stderr=subprocess.STDOUT
        )
    try:
        yield psutil.Process(operator.pid)
    finally:
        stop(operator)


def is_ready(pool: dict[str, Any]) -> bool:
    return any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in pool.get("status", {}).get("conditions", [])
    )


def apply_and_wait_ready(
    custom: kubernetes.client.CustomObjectsApi,
    operator: psutil.Process,
    pools: int,
    replicas: int,
    timeout: float,
) -> dict[str, Any]:
    names = [f"pool-{i:04d}" for i in range(pools)]
    started = time.monotonic()
    with ThreadPoolExecutor(8) as executor:
        list(
            executor.map(
                lambda name: custom.create_namespaced_custom_object(
                    GROUP, VERSION, NAMESPACE, PLURAL, pool_body(name, replicas)
                ),
                names,
            )
        )
    applied_s = time.monotonic() - started
    # Ready pools and the operator's CPU seconds every PROGRESS_SECONDS, also shown on stderr.
    timeline: list[tuple[float, int, float]] = []

    def progress(ready: int) -> None:
        elapsed = time.monotonic() - started
        if timeline and elapsed - timeline[-1][0] < PROGRESS_SECONDS and ready < pools:
            return
        timeline.append((round(elapsed, 1), ready, round(cpu_seconds(operator.pid), 1)))
        print(
            f"scale: {ready}/{pools} pools Ready after {elapsed:.0f} s "
            f"(operator CPU {timeline[-1][2]} s, load {os.getloadavg()[0]:.1f})",
            file=sys.stderr,
            flush=True,
        )

    ready = watch_ready(custom, pools, started + timeout, progress)
    all_ready = time.monotonic() - started if ready == pools else None
    return {
        "apply_seconds": round(applied_s, 2),
        "all_ready_seconds": None if all_ready is None else round(all_ready, 2),
        "ready_pools": ready,
        "ready_timeline_seconds_pools_operator_cpu": timeline,
    }


def watch_ready(
    custom: kubernetes.client.CustomObjectsApi,
    pools: int,
    deadline: float,
    progress: Callable[[int], None],
) -> int:
    """Ready pools once all are or at the deadline. Watched, not polled: listing 1,000 pools
    every second would load the API server the ramp is measuring."""
    ready: dict[str, bool] = {}
    while sum(ready.values()) < pools and time.monotonic() < deadline:
        listing = custom.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL)
        ready = {p["metadata"]["name"]: is_ready(p) for p in listing["items"]}
        progress(sum(ready.values()))
        stream = kubernetes.watch.Watch().stream(
            custom.list_namespaced_custom_object,
            GROUP,
            VERSION,
            NAMESPACE,
            PLURAL,
            resource_version=listing["metadata"]["resourceVersion"],
            timeout_seconds=max(1, min(30, int(deadline - time.monotonic()))),
        )
        with contextlib.suppress(kubernetes.client.ApiException):  # expired: list again
            for event in stream:
                ready[event["object"]["metadata"]["name"]] = is_ready(event["object"])
                progress(sum(ready.values()))
                if sum(ready.values()) == pools:
                    break
    return sum(ready.values())


@dataclass
class Sample:
    at: float
    cpu_seconds: float
    rss_mb: float
    probes: int


def sample(operator: psutil.Process, farm: str) -> Sample:
    return Sample(
        at=time.time(),
        cpu_seconds=cpu_seconds(operator.pid),
        rss_mb=operator.memory_info().rss / 2**20,
        probes=farm_call(farm, "/farm/stats")["probes"],
    )


@dataclass
class Request:
    """One request of the operator's, from the audit log."""

    kind: str  # verb and resource, e.g. "patch statefulsets", "patch envpools/status"
    received: float
    seconds: float  # until the response was complete


def audit_requests(log: Path, since: float, until: float) -> list[Request]:
    """The operator's requests received in [since, until)."""
    requests = []
    for line in log.read_text().splitlines():
        event = json.loads(line)
        at = datetime.datetime.fromisoformat(event["requestReceivedTimestamp"]).timestamp()
        if not since <= at < until:
            continue
        done = datetime.datetime.fromisoformat(event["stageTimestamp"]).timestamp()
        ref = event.get("objectRef", {})
        resource = ref.get("resource", "?") + (
            f"/{ref['subresource']}" if "subresource" in ref else ""
        )
        requests.append(Request(f"{event['verb']} {resource}", at, done - at))
    return requests


def audit_counts(log: Path, since: float, until: float) -> collections.Counter[str]:
    """The operator's requests received in [since, until), by verb and resource."""
    return collections.Counter(r.kind for r in audit_requests(log, since, until))


def ramp_requests(log: Path, since: float, until: float) -> dict[str, Any]:
    """What the operator asked of the API server while the pools came up: how many requests of
    each kind, when it had applied the last StatefulSet, and how long its applies took."""
    requests = audit_requests(log, since, until)
    applies = [r for r in requests if r.kind.startswith("patch ") and "/" not in r.kind]
    last_statefulset = max(
        (r.received for r in requests if r.kind == "patch statefulsets"), default=since
    )
    apply_ms = [1000 * r.seconds for r in applies]
    return {
        "api_requests_until_ready": len(requests),
        "api_requests_until_ready_by_kind": dict(
            collections.Counter(r.kind for r in requests).most_common()
        ),
        "children_applied_seconds": round(last_statefulset - since, 1),
        "apply_ms_p50": round(percentile(apply_ms, 50), 1) if apply_ms else None,
        "apply_ms_p90": round(percentile(apply_ms, 90), 1) if apply_ms else None,
    }


def control_plane_pids() -> list[int]:
    """This bench's etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok."""
    return [
        child.pid
        for child in psutil.Process().children(recursive=True)
        if child.name() in CONTROL_PLANE_PROCESSES
    ]


def steady_state(
    operator: psutil.Process, farm: str, audit_log: Path, pods: int, seconds: float
) -> dict[str, Any]:
    before = sample(operator, farm)
    probed_before = farm_call(farm, "/farm/probes")
    psutil.cpu_percent()
    time.sleep(seconds)
    machine_cpu = psutil.cpu_percent()
    after = sample(operator, farm)
    probed_after = farm_call(farm, "/farm/probes")
    window = after.at - before.at
    counts = audit_counts(audit_log, before.at, after.at)
    status_writes = sum(n for key, n in counts.items() if key.endswith("envpools/status"))
    return {
        "window_seconds": round(window, 1),
        "operator_cpu_percent": round(100 * (after.cpu_seconds - before.cpu_seconds) / window, 1),
        "operator_rss_mb": round(after.rss_mb, 1),
        # Everything on the machine: the control plane, kwok, the farm, and other work.
        "machine_cpu_percent": machine_cpu,
        "probes_per_second": round((after.probes - before.probes) / window, 1),
        "probes_per_second_required": round(pods / WATCHDOG.probe_period_seconds, 1),
        # The pods the watchdog looked at in the window at all; the rate above says how often.
        "pods_probed": sum(1 for uid, n in probed_after.items() if n > probed_before.get(uid, 0)),
        "pods": pods,
        "api_requests_per_second": round(sum(counts.values()) / window, 2),
        "api_requests_by_kind": dict(counts.most_common()),
        "status_writes_per_second": round(status_writes / window, 3),
    }


def frozen_pod(
    core: kubernetes.client.CoreV1Api,
    custom: kubernetes.client.CustomObjectsApi,
    farm: str,
    pool: str,
    timeout: float,
) -> dict[str, Any]:
    """Freeze one env server; time until the watchdog deletes it and until its replacement is
    Ready and the pool Ready again."""
    name = f"{pool}-3"
    uid = core.read_namespaced_pod(name, NAMESPACE).metadata.uid
    farm_call(farm, "/farm/freeze", {"uid": uid})
    started = time.monotonic()
    detected = replaced = None
    while replaced is None and time.monotonic() - started < timeout:
        time.sleep(0.2)
        try:
            pod = core.read_namespaced_pod(name, NAMESPACE)
        except kubernetes.client.ApiException as error:
            if error.status != 404:
                raise
            pod = None
        if detected is None and (pod is None or pod.metadata.uid != uid):
            detected = time.monotonic() - started
        if detected is not None and pod is not None and pod.metadata.uid != uid:
            ready = any(
                c.type == "Ready" and c.status == "True" for c in pod.status.conditions or []
            )
            if ready and is_ready(
                custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, pool)
            ):
                replaced = time.monotonic() - started
    bound = WATCHDOG.failure_threshold * WATCHDOG.probe_period_seconds
    restarts = custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, pool)
    return {
        "pool": pool,
        "pod": name,
        "detect_seconds": None if detected is None else round(detected, 2),
        "replaced_ready_seconds": None if replaced is None else round(replaced, 2),
        "detect_bound_seconds": bound + TARGETS["frozen_detect_slack_seconds"],
        "restart_reason": restarts.get("status", {}).get("restarts", {}).get("lastReason"),
    }


@contextlib.contextmanager
def audit_log() -> Iterator[tuple[list[str], Path]]:
    """kube-apiserver flags that log the operator's requests (AUDIT_POLICY), and the log file."""
    with tempfile.TemporaryDirectory(prefix="gymkube-scale-audit-") as directory:
        policy = Path(directory) / "policy.json"
        policy.write_text(json.dumps(AUDIT_POLICY))
        log = Path(directory) / "audit.log"
        flags = [f"--audit-policy-file={policy}", f"--audit-log-path={log}"]
        yield [*flags, "--audit-log-format=json"], log


def ramp_cpu(
    control_plane: list[int], operator: psutil.Process, before: tuple[float, float]
) -> dict[str, float]:
    """CPU seconds the control plane (with kwok) and the operator spent while the pools came
    up, and the shortest ramp those seconds allow on this machine's cores."""
    control_plane_s = sum(map(cpu_seconds, control_plane)) - before[0]
    operator_s = cpu_seconds(operator.pid) - before[1]
    return {
        "control_plane": round(control_plane_s, 1),
        "operator": round(operator_s, 1),
        "floor_seconds_on_these_cpus": round((control_plane_s + operator_s) / CPUS, 1),
    }


def run_size(
    pools: int, replicas: int, steady: float, operator_bin: Path, settings: dict[str, str]
) -> dict[str, Any]:
    pods = pools * replicas
    nodes = math.ceil(pools * (replicas + 1) / PODS_PER_NODE) + 1
    with contextlib.ExitStack() as stack:
        farm = stack.enter_context(running_farm())
        audit_flags, audit = stack.enter_context(audit_log())
        service_cidr = f"--service-cluster-ip-range={SERVICE_CIDR}"
        extra = {
            "kube-apiserver": [*audit_flags, service_cidr],
            "kube-controller-manager": [*CONTROLLER_MANAGER_SCALE_ARGS, service_cidr],
        }
        kube = stack.enter_context(running_control_plane(extra_args=extra))
        stack.enter_context(running_kwok(kube, nodes, PODS_PER_NODE))
        kube.kubectl("apply", "--server-side", "-f", str(package_file(ENVPOOL)))
        kube.kubectl("wait", "--for=condition=Established", f"crd/{ENVPOOL.name}")
        kube.kubectl("create", "namespace", NAMESPACE)
        log_path = kube.workdir / "operator.log"
        operator = stack.enter_context(
            running_operator(kube, farm, operator_bin, log_path, settings)
        )
        client = stack.enter_context(kube.api_client())
        rss = PeakRss(operator.pid)
        custom = kubernetes.client.CustomObjectsApi(client)
        core = kubernetes.client.CoreV1Api(client)
        control_plane = control_plane_pids()
        cpu_before = sum(map(cpu_seconds, control_plane)), cpu_seconds(operator.pid)
        applied_at = time.time()
        ramp = apply_and_wait_ready(
            custom, operator, pools, replicas, timeout=READY_TIMEOUT_SECONDS
        )
        ramp.update(ramp_requests(audit, applied_at, time.time()))
        ramp["ramp_cpu_seconds"] = ramp_cpu(control_plane, operator, cpu_before)
        time.sleep(2 * WATCHDOG.probe_period_seconds)  # the last Ready writes land
        steady_figures = steady_state(operator, farm, audit, pods, steady)
        frozen = frozen_pod(core, custom, farm, f"pool-{pools // 2:04d}", timeout=120)
        peak = rss.stop()
        errors = [
            line for line in log_path.read_text(errors="replace").splitlines() if "ERROR" in line
        ]
    return {
        "pools": pools,
        "replicas": replicas,
        "env_server_pods": pods,
        "fake_nodes": nodes,
        **ramp,
        "steady_state": steady_figures,
        "frozen_pod": frozen,
        "operator_peak_rss_mb": round(peak, 1),
        "operator_settings": settings,
        "operator_errors": errors[-5:],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pools", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--replicas", type=int, default=10)
    parser.add_argument("--steady", type=float, default=30.0, help="seconds of steady state")
    parser.add_argument(
        "--operator",
        type=Path,
        default=Path(sys.executable).parent / "gymkube-operator",
        help="the gymkube-operator executable to run",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="GYMKUBE_NAME=VALUE",
        help="an operator setting for the run (e.g. GYMKUBE_APPLY_CONCURRENCY=24); repeatable",
    )
    options = parser.parse_args()
    # Stopped from outside, still stop the operator and the farm and remove the control plane.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if bad := [item for item in options.set if "=" not in item]:
        parser.error(f"--set takes NAME=VALUE, not {bad[0]!r}")
    settings = dict(item.split("=", 1) for item in options.set)
    results = []
    for pools in options.pools:
        load_before = os.getloadavg()
        result = run_size(pools, options.replicas, options.steady, options.operator, settings)
        result["load_average_before"] = [round(x, 2) for x in load_before]
        result["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
        results.append(result)
        print(json.dumps(result), file=sys.stderr, flush=True)
    print(json.dumps({"cpus": os.cpu_count(), "targets": TARGETS, "runs": results}, indent=2))


if __name__ == "__main__":
    main()
