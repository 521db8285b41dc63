"""What the e2e tests need from a real cluster: typed settings, the dev tooling's cluster client
(gymkube_dev.kube) with condition polling, HTTP to one pod through the API server and kubectl
exec on top, and its diagnostics dump for failed tests.

Everything goes through the kubeconfig alone (the API server's pod proxy reaches pods), so the
same tests run on kind and on hack/local-cluster.sh.
"""

import contextlib
import json
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from gymkube_dev import CHART, diagnostics
from gymkube_dev.images import app_version, image_ref
from gymkube_dev.kube import Kube, KubeError, api_path, gymkube_path
from gymkube_dev.objects import ENVSERVER_PORT, Object, condition, condition_is, is_ready
from gymkube_dev.settings import OPERATOR_NAMESPACE, RELEASE
from gymkube_operator.kinds import API_VERSION, GROUP, VERSION
from gymkube_operator.labels import COMPONENT_LABEL, POOL_LABEL
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

OPT_IN = "GYMKUBE_E2E_KUBECONFIG"

T = TypeVar("T")

# Finds the env-server process inside its container: not PID 1 (tini, whose argv names the
# server too, and which ignores signals sent from inside its namespace), not this script.
_FIND_ENVSERVER = """
import json, os, signal, sys, time, urllib.request
def envserver_pid():
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in (1, me):
            continue
        try:
            argv = open(f"/proc/{entry}/cmdline", "rb").read().split(b"\\0")
        except OSError:
            continue
        if any(os.path.basename(arg) == b"gymkube-envserver" for arg in argv):
            return int(entry)
    sys.exit("no gymkube-envserver process found")
"""
# argv: the signal's name.
SIGNAL_ENVSERVER = (
    _FIND_ENVSERVER
    + """
pid = envserver_pid()
os.kill(pid, getattr(signal, sys.argv[1]))
print(pid)
"""
)
# argv: the server's port. Polls its /status from inside the pod, so the SIGSTOP lands within
# tens of milliseconds of the next session's create; a poll that times out is asked again. Prints
# the replays the server had played by then (its count goes with it when it is replaced).
FREEZE_AT_NEXT_SESSION = (
    _FIND_ENVSERVER
    + """
pid = envserver_pid()
def status():
    url = f"http://127.0.0.1:{sys.argv[1]}/status"
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                return json.load(answer)
        except OSError:  # a node starved by the trainer can leave one answer past 5 s
            time.sleep(0.2)
before = status()["served"]
while (last := status())["served"] == before:
    time.sleep(0.05)
# served counts a session before its /create reply is written: stopped at once, the router would
# find the server dead and place the create elsewhere, and no episode would be cut. The reply is
# out within milliseconds; the episode's first turn (a model generation) takes seconds.
time.sleep(0.2)
os.kill(pid, signal.SIGSTOP)
print(json.dumps({"pid": pid, "replays": last.get("replays", 0)}))
"""
)
__all__ = [  # what the tests import from here, defined elsewhere
    "COMPONENT_LABEL",
    "ENVSERVER_PORT",
    "GROUP",
    "POOL_LABEL",
    "VERSION",
    "Object",
    "api_path",
    "condition",
    "condition_is",
    "gymkube_path",
    "is_ready",
]


class E2ESettings(BaseSettings):
    """GYMKUBE_E2E_* environment variables; only the kubeconfig is required."""

    model_config = SettingsConfigDict(env_prefix="GYMKUBE_E2E_", frozen=True)

    kubeconfig: Path = Field(description="Kubeconfig of the cluster under test (the opt-in).")
    release: str = Field(RELEASE, description="Helm release name of the operator.")
    operator_namespace: str = Field(OPERATOR_NAMESPACE, description="Where the chart goes.")
    chart: Path = Field(CHART, description="The chart to install.")
    image_tag: str = Field(
        default_factory=app_version,
        description="Tag of the gymkube images under test (default: the chart's appVersion).",
    )
    image_pull_policy: str = Field(
        "IfNotPresent", description="Never/IfNotPresent for images loaded into the cluster."
    )
    pool_ready_timeout_s: float = Field(
        600.0, description="EnvPool apply → Ready (ScienceWorld starts JVMs)."
    )
    pod_start_timeout_s: float = Field(180.0, description="A replaced env pod becoming Ready.")
    registry: str | None = Field(
        None,
        description="A registry holding the images (hack/registry.sh; host:port), which the "
        "registry test moves the operator and its default images to.",
    )
    controllers: bool = Field(
        False,
        description="KubeRay's and Kueue's controllers are installed (hack/controllers.sh): the "
        "runs that queue in Kueue and train as a RayJob need them.",
    )

    keep_operator: bool = Field(
        False,
        description="Leave the chart installed when the session ends, for a session after it on "
        "the same cluster (hack/test-e2e.sh runs the suite as two sessions).",
    )
    network_policy_enforced: bool = Field(
        False,
        description="The cluster's network plugin enforces NetworkPolicy (hack/test-e2e.sh makes "
        "Cilium kind's CNI): the test that a policy keeps pods out needs it.",
    )

    def image(self, component: str) -> str:
        return image_ref(component, self.image_tag)

    @property
    def preflight_image(self) -> str:
        """The image with gymkube-preflight, as the operator's preflight Jobs use."""
        return self.image("preflight")


# Every namespace a test makes carries this label; the session ends when none is left.
TEST_NAMESPACE_LABEL = "gymkube-e2e"
# Namespaces with this label may scrape the env servers' /metrics through the pools' policies, as
# a user's monitoring namespace would (the chart's networkPolicy.metricsScrapers).
SCRAPER_NAMESPACE_LABELS = {"gymkube-e2e-scraper": "true"}


def chart_values(settings: E2ESettings) -> dict[str, Any]:
    """Values pointing the chart at the images under test (loaded into the cluster, not pulled),
    with the e2e scrapers' namespaces let through the pools' NetworkPolicies."""
    tag = {"tag": settings.image_tag}
    return {
        "networkPolicy": {"metricsScrapers": {"namespaceLabels": SCRAPER_NAMESPACE_LABELS}},
        "image": {"tag": settings.image_tag, "pullPolicy": settings.image_pull_policy},
        "defaultImages": {
            "envServer": tag,
            "router": tag,
            "preflight": tag,
            "trainerCpu": tag,
            "pullPolicy": settings.image_pull_policy,
        },
    }


def wait_until(
    check: Callable[[], T | bool | None], *, timeout: float, what: str, interval: float = 1.0
) -> T:
    """Polls CHECK until it returns something truthy; fails naming WHAT on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value  # type: ignore[return-value]
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


class Cluster(Kube):
    """The cluster under test, with what the tests wait for and play on it."""

    def __init__(self, settings: E2ESettings) -> None:
        super().__init__(settings.kubeconfig)
        self.settings = settings

    def kubectl(
        self, *args: str, check: bool = True, timeout: float = 120.0, with_stderr: bool = False
    ) -> str:
        """Kube.kubectl, its failure a test failure (an AssertionError carrying kubectl's
        stderr, which callers may read, e.g. for an exec's exit code)."""
        try:
            return super().kubectl(*args, check=check, timeout=timeout, with_stderr=with_stderr)
        except KubeError as err:
            raise AssertionError(str(err)) from err

    # --- gymkube resources -------------------------------------------------------------------

    def wait_condition(
        self,
        namespace: str,
        plural: str,
        name: str,
        kind: str,
        *,
        timeout: float,
        status: str = "True",
        extra: Callable[[Object], bool] = lambda _: True,
    ) -> Object:
        """Polls until condition KIND has STATUS for the current generation and EXTRA holds."""

        def check() -> Object | None:
            obj = self.get(gymkube_path(plural, namespace, name))
            if obj is None or not condition_is(obj, kind, status):
                return None
            generation = obj["metadata"].get("generation", 0)
            observed = (obj.get("status") or {}).get("observedGeneration", 0)
            return obj if observed >= generation and extra(obj) else None

        return wait_until(
            check, timeout=timeout, what=f"{plural}/{name} {kind}={status} in {namespace}"
        )

    def wait_pool_ready(
        self, namespace: str, name: str, extra: Callable[[Object], bool] = lambda _: True
    ) -> Object:
        return self.wait_condition(
            namespace,
            "envpools",
            name,
            "Ready",
            timeout=self.settings.pool_ready_timeout_s,
            extra=extra,
        )

    # --- pods --------------------------------------------------------------------------------

    def pods(self, namespace: str, selector: str) -> list[Object]:
        return self.list_objects(api_path("v1", "pods", namespace), selector)

    def pod_ready(self, namespace: str, name: str) -> Object | None:
        pod = self.get(api_path("v1", "pods", namespace, name))
        return pod if pod is not None and is_ready(pod) else None

    def pod_http(
        self,
        namespace: str,
        pod: str,
        port: int,
        path: str,
        body: Object | None = None,
        *,
        timeout: float = 10.0,
    ) -> tuple[int, Object]:
        """GET (or POST BODY) http://POD:PORT/PATH through the API server's pod proxy."""
        proxy = f"{api_path('v1', 'pods', namespace, f'{pod}:{port}')}/proxy/{path.lstrip('/')}"
        return self.request("GET" if body is None else "POST", proxy, body, timeout=timeout)

    def exec_python(self, namespace: str, pod: str, code: str, container: str | None = None) -> str:
        """Runs python3 -c CODE in POD (the gymkube images all carry Python)."""
        target = ["-c", container] if container else []
        return self.kubectl("exec", "-n", namespace, pod, *target, "--", "python3", "-c", code)

    def signal_envserver(self, namespace: str, pod: str, signal_name: str) -> None:
        """Sends SIGNAL_NAME (SIGSTOP, SIGKILL, ...) to the env server process in POD."""
        try:
            self.kubectl(
                "exec", "-n", namespace, pod, "--", "python3", "-c", SIGNAL_ENVSERVER, signal_name
            )
        except AssertionError as exc:
            # A killed server takes its container down, and this exec with it (137), sometimes
            # before the exec has returned; the callers check that the server was brought back.
            if signal_name != "SIGKILL" or "exit code 137" not in str(exc):
                raise

    def freeze_envserver_at_next_session(self, namespace: str, pod: str, timeout: float) -> int:
        """SIGSTOPs the env server in POD as soon as it creates its next session (waiting for it
        up to TIMEOUT s): that session's episode has every turn still to play. Returns the replays
        the server had played until then."""
        output = self.kubectl(
            "exec",
            "-n",
            namespace,
            pod,
            "--",
            "python3",
            "-c",
            FREEZE_AT_NEXT_SESSION,
            str(ENVSERVER_PORT),
            timeout=timeout,
        )
        assert output.strip(), f"the freeze in {pod} printed nothing: its exec ended early"
        return int(json.loads(output.splitlines()[-1])["replays"])

    def dump(self, namespace: str) -> str:
        """Operator logs, events and pod descriptions, for a failed test's report."""
        ops, release = self.settings.operator_namespace, self.settings.release
        return diagnostics.dump(self, namespace, ops, release)


# --- gymkube objects the tests create --------------------------------------------------------


# For tests that freeze a server and wait for the watchdog: a silent server is replaced within
# ~9 s, yet a live one on a starved two-core node (a ScienceWorld step can take 3 s there) is not.
# Pools in other tests keep the watchdog's defaults: a 1 s timeout replaced busy servers in CI.
FAST_WATCHDOG = {
    "probePeriodSeconds": 3,
    "probeTimeoutSeconds": 2,
    "failureThreshold": 3,
    "canaryIntervalSeconds": 0,
}


def envpool_manifest(name: str, env: str, replicas: int, **spec: Any) -> Object:
    """A small EnvPool sized for a CI node: the default watchdog, canary off unless asked for.
    Its CPU requests are token ones: the 2-core node schedules these pools beside the control
    plane and a CPU training (hack/test-e2e.sh runs tests beside the queued trainings)."""
    body: Object = {
        "env": env,
        "replicas": replicas,
        "sessionsPerReplica": 2,
        "warmSessionsPerReplica": 1,
        "resources": {"requests": {"cpu": "10m", "memory": "128Mi"}},
        "router": {"replicas": 1, "resources": {"requests": {"cpu": "10m", "memory": "64Mi"}}},
        "watchdog": {"canaryIntervalSeconds": 0},
    }
    body.update(spec)
    return {
        "apiVersion": API_VERSION,
        "kind": "EnvPool",
        "metadata": {"name": name},
        "spec": body,
    }


def envserver_selector(pool: str) -> str:
    return f"{POOL_LABEL}={pool},{COMPONENT_LABEL}=envserver"


def _counter(metrics: str, name: str) -> float:
    """A counter's value in Prometheus text (prometheus_client adds _total to counters)."""
    match = re.search(rf"^{name}(?:_total)?(?:\{{\}})? (\S+)$", metrics, re.MULTILINE)
    assert match is not None, f"no {name} in /metrics"
    return float(match.group(1))


def pool_counts(operator: Cluster, namespace: str, pool: str) -> tuple[float, float]:
    """(episodes ended, sum of their last scores) by POOL's env servers' own /metrics."""
    episodes = score = 0.0
    for pod in operator.names(api_path("v1", "pods", namespace), envserver_selector(pool)):
        proxy = api_path("v1", "pods", namespace, f"{pod}:{ENVSERVER_PORT}") + "/proxy/metrics"
        body = operator.get_bytes(proxy)
        assert body is not None, f"/metrics of {pod}"
        text = body.decode()
        episodes += _counter(text, "gymkube_envserver_episodes")
        score += _counter(text, "gymkube_envserver_episode_score")
    return episodes, score


def pool_restarts(operator: Cluster, namespace: str, pool: str) -> int:
    """POOL's env-server pods the watchdog replaced, and containers the kubelet restarted: each
    took its server's counts (`pool_counts`) with it."""
    found = operator.get(gymkube_path("envpools", namespace, pool)) or {}
    replaced = int(((found.get("status") or {}).get("restarts") or {}).get("count", 0))
    pods = operator.list_objects(api_path("v1", "pods", namespace), envserver_selector(pool))
    restarted = sum(
        int(container.get("restartCount", 0))
        for pod in pods
        for container in (pod.get("status") or {}).get("containerStatuses") or []
    )
    return replaced + restarted


def preflight_job(name: str, image: str, pull_policy: str, url: str, env: str) -> Object:
    """A Job running gymkube-preflight against URL from inside the cluster."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": 600,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "preflight",
                            "image": image,
                            "imagePullPolicy": pull_policy,
                            "command": ["gymkube-preflight"],
                            "args": [
                                "--env-url",
                                url,
                                "--env",
                                env,
                                "--episodes",
                                "2",
                                "--policy",
                                "scripted",
                            ],
                        }
                    ],
                }
            },
        },
    }


def finished(operator: Cluster, plural: str, namespace: str, name: str, timeout: float) -> Object:
    """The gymkube object (a trainingrun, an evalrun) once Succeeded or Failed is True."""
    path = gymkube_path(plural, namespace, name)

    def ended() -> Object | None:
        found = operator.get(path) or {}
        done = any(
            c.get("type") in ("Succeeded", "Failed") and c.get("status") == "True"
            for c in (found.get("status") or {}).get("conditions") or []
        )
        return found if done else None

    return wait_until(ended, timeout=timeout, what=f"{plural}/{name} to finish")


# On the node's disk, not under /tmp: a kind node's /tmp is a tmpfs, where the checkpoints a
# trainer writes (1.5 GB a step for SmolLM2-135M) would count against its pod's memory limit.
# node_directory removes what it made.
NODE_DIR = "/var/lib/gymkube-e2e"


def run_on_node(
    operator: Cluster, settings: E2ESettings, namespace: str, name: str, command: str
) -> None:
    """Run a shell command as root in a pod with the node's NODE_DIR at /e2e, to its end."""
    volume = {"hostPath": {"path": NODE_DIR, "type": "DirectoryOrCreate"}}
    operator.create(
        api_path("v1", "pods", namespace),
        {
            "metadata": {"name": name},
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": name,
                        "image": settings.preflight_image,
                        "imagePullPolicy": settings.image_pull_policy,
                        "command": ["sh", "-c", command],
                        "securityContext": {"runAsUser": 0},
                        "volumeMounts": [{"name": "e2e", "mountPath": "/e2e"}],
                    }
                ],
                "volumes": [{"name": "e2e", **volume}],
            },
        },
    )

    def done() -> bool:
        pod = operator.get(api_path("v1", "pods", namespace, name)) or {}
        return (pod.get("status") or {}).get("phase") == "Succeeded"

    wait_until(done, timeout=120, what=f"pod {name} to finish `{command}`")


@contextlib.contextmanager
def node_directory(
    operator: Cluster, settings: E2ESettings, namespace: str, make: Callable[[str], str]
) -> Iterator[Object]:
    """A directory of the node's for this test's namespace, made by the shell command
    make(its path in the pod), as a hostPath volume that outlives pods; removed afterwards."""
    directory = f"/e2e/{namespace}"
    run_on_node(operator, settings, namespace, "node-dir", make(directory))
    try:
        yield {"hostPath": {"path": f"{NODE_DIR}/{namespace}", "type": "Directory"}}
    finally:
        run_on_node(operator, settings, namespace, "node-dir-gone", f"rm -rf {directory}")


# --- Kueue (hack/controllers.sh installs it beside kind) -------------------------------------

KUEUE_API = "kueue.x-k8s.io/v1beta2"
LOCAL_QUEUE = "training"
# WorkloadPriorityClasses shared by the suite's runs (cluster-scoped; made when first needed).
PRIORITIES = {"gymkube-e2e-low": 100, "gymkube-e2e-high": 1000}
# One CPU run's trainer asks for 500m and 4Gi: this quota holds one, never two.
ONE_CPU_RUN_QUOTA = {"cpu": "1", "memory": "6Gi"}


def needs_controllers(settings: E2ESettings) -> None:
    """The queued and preempted runs need a real Kueue: without it they are a usage error, never
    a skip (hack/test-e2e.sh installs it on kind and on the local cluster alike)."""
    if not settings.controllers:
        pytest.fail(
            "this test needs KubeRay and Kueue in the cluster: install them with "
            "`hack/controllers.sh install kind|local` (or as docs/trainingrun.md says on your own "
            "cluster) and set GYMKUBE_E2E_CONTROLLERS=true",
            pytrace=False,
        )


def _create_if_absent(operator: Cluster, path: str, body: Object) -> None:
    if operator.get(f"{path}/{body['metadata']['name']}") is None:
        operator.create(path, body)


@contextlib.contextmanager
def kueue_queue(operator: Cluster, namespace: str) -> Iterator[str]:
    """A LocalQueue in NAMESPACE over a ClusterQueue of its own whose quota fits one CPU run,
    preempting lower priorities for higher ones; yields the LocalQueue's name. The ClusterQueue
    is deleted afterwards (the LocalQueue goes with the namespace)."""
    flavor = "gymkube-e2e"
    _create_if_absent(
        operator,
        api_path(KUEUE_API, "resourceflavors"),
        {"apiVersion": KUEUE_API, "kind": "ResourceFlavor", "metadata": {"name": flavor}},
    )
    for name, value in PRIORITIES.items():
        _create_if_absent(
            operator,
            api_path(KUEUE_API, "workloadpriorityclasses"),
            {
                "apiVersion": KUEUE_API,
                "kind": "WorkloadPriorityClass",
                "metadata": {"name": name},
                "value": value,
            },
        )
    cluster_queue = namespace
    operator.create(
        api_path(KUEUE_API, "clusterqueues"),
        {
            "apiVersion": KUEUE_API,
            "kind": "ClusterQueue",
            "metadata": {"name": cluster_queue},
            "spec": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "preemption": {"withinClusterQueue": "LowerPriority"},
                "resourceGroups": [
                    {
                        "coveredResources": list(ONE_CPU_RUN_QUOTA),
                        "flavors": [
                            {
                                "name": flavor,
                                "resources": [
                                    {"name": resource, "nominalQuota": quota}
                                    for resource, quota in ONE_CPU_RUN_QUOTA.items()
                                ],
                            }
                        ],
                    }
                ],
            },
        },
    )
    operator.create(
        api_path(KUEUE_API, "localqueues", namespace),
        {
            "apiVersion": KUEUE_API,
            "kind": "LocalQueue",
            "metadata": {"name": LOCAL_QUEUE},
            "spec": {"clusterQueue": cluster_queue},
        },
    )
    try:
        yield LOCAL_QUEUE
    finally:
        operator.delete(api_path(KUEUE_API, "clusterqueues", name=cluster_queue))


def suspended_while_queued(
    operator: Cluster, namespace: str, run: str, says: str
) -> Callable[[], Object | None]:
    """The run's Suspended condition once the run is Queued and its message says `says`, Kueue's
    words: Kueue makes the Workload a moment after the operator creates the child and writes why it
    waits a moment later, which wakes the run to read it again."""

    def queued() -> Object | None:
        found = operator.get(gymkube_path("trainingruns", namespace, run)) or {}
        status = found.get("status") or {}
        if status.get("phase") != "Queued":
            return None
        suspended = condition(found, "Suspended")
        return suspended if suspended and says in suspended.get("message", "") else None

    return queued
