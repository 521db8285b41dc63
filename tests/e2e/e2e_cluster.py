"""What the e2e tests need from a real cluster: typed settings, API clients, condition polling,
HTTP to one pod through the API server, and a diagnostic dump for failed tests.

Everything goes through the kubeconfig alone (the API server's pod proxy reaches pods), so the
same tests run on kind and on hack/local-cluster.sh.
"""

import json
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

REPO = Path(__file__).resolve().parents[2]
GROUP = "gymkube.io"
VERSION = "v1alpha1"
OPT_IN = "GYMKUBE_E2E_KUBECONFIG"

T = TypeVar("T")
Object = dict[str, Any]


def _tool_dir() -> Path | None:
    """hack/tool-path.sh's directory, when the pinned tools were built on this machine."""
    script = REPO / "hack" / "tool-path.sh"
    if not script.exists():
        return None
    out = subprocess.run([str(script)], capture_output=True, text=True, check=False)
    path = Path(out.stdout.strip())
    return path if out.returncode == 0 and path.is_dir() else None


def find_tool(name: str) -> str:
    """A pinned tool from hack/build-tools.sh, else the one on PATH (users' CI)."""
    tool_dir = _tool_dir()
    if tool_dir and (tool_dir / name).exists():
        return str(tool_dir / name)
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} not found: run `make tools` or put {name} on PATH")
    return found


class E2ESettings(BaseSettings):
    """GYMKUBE_E2E_* environment variables; only the kubeconfig is required."""

    model_config = SettingsConfigDict(env_prefix="GYMKUBE_E2E_", frozen=True)

    kubeconfig: Path = Field(description="Kubeconfig of the cluster under test (the opt-in).")
    release: str = Field("gymkube", description="Helm release name of the operator.")
    operator_namespace: str = Field("gymkube-system", description="Where the chart goes.")
    chart: Path = Field(REPO / "charts" / "gymkube", description="The chart to install.")
    image_tag: str = Field("0.1.0", description="Tag of the gymkube images under test.")
    image_pull_policy: str = Field(
        "IfNotPresent", description="Never/IfNotPresent for images loaded into the cluster."
    )
    pool_ready_timeout_s: float = Field(
        600.0, description="EnvPool apply → Ready (ScienceWorld starts JVMs)."
    )
    preflight_image: str = Field(
        "gymkube/envserver:0.1.0", description="Image with gymkube-preflight on its PATH."
    )
    pod_start_timeout_s: float = Field(180.0, description="A replaced env pod becoming Ready.")

    def image(self, component: str) -> str:
        return f"gymkube/{component}:{self.image_tag}"


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


def _json_object(payload: str | bytes) -> Object:
    if isinstance(payload, bytes):
        payload = payload.decode(errors="replace")
    try:
        parsed = json.loads(payload) if payload else {}
    except json.JSONDecodeError:
        return {"text": payload}
    return parsed if isinstance(parsed, dict) else {"value": parsed}


def condition(obj: Object | None, kind: str) -> Object | None:
    """The metav1.Condition of type KIND in OBJ's status, if any."""
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return None


def condition_is(obj: Object | None, kind: str, status: str = "True") -> bool:
    cond = condition(obj, kind)
    return cond is not None and cond.get("status") == status


class Cluster:
    """Thin typed access to the cluster the kubeconfig names."""

    def __init__(self, settings: E2ESettings) -> None:
        self.settings = settings
        self.api_client = config.new_client_from_config(config_file=str(settings.kubeconfig))
        self.core = client.CoreV1Api(self.api_client)
        self.apps = client.AppsV1Api(self.api_client)
        self.batch = client.BatchV1Api(self.api_client)
        self.custom = client.CustomObjectsApi(self.api_client)
        self.apiext = client.ApiextensionsV1Api(self.api_client)
        self.policy = client.PolicyV1Api(self.api_client)
        self.kubectl_bin = find_tool("kubectl")

    # --- gymkube resources -------------------------------------------------------------------

    def apply_custom(self, namespace: str, plural: str, body: Object) -> Object:
        result: Object = self.custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, plural, body
        )
        return result

    def get_custom(self, namespace: str, plural: str, name: str) -> Object | None:
        try:
            result: Object = self.custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, plural, name
            )
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        return result

    def delete_custom(self, namespace: str, plural: str, name: str) -> None:
        self.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, plural, name)

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
            obj = self.get_custom(namespace, plural, name)
            if obj is None:
                return None
            cond = condition(obj, kind)
            current = cond is not None and cond.get("status") == status
            generation = obj["metadata"].get("generation", 0)
            observed = (obj.get("status") or {}).get("observedGeneration", 0)
            return obj if current and observed >= generation and extra(obj) else None

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

    def pods(self, namespace: str, selector: str) -> list[client.V1Pod]:
        items: list[client.V1Pod] = self.core.list_namespaced_pod(
            namespace, label_selector=selector
        ).items
        return sorted(items, key=lambda pod: pod.metadata.name)

    def pod_ready(self, namespace: str, name: str) -> client.V1Pod | None:
        try:
            pod = self.core.read_namespaced_pod(name, namespace)
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        if pod.metadata.deletion_timestamp is not None:
            return None
        ready = any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []))
        return pod if ready else None

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
        method = "GET" if body is None else "POST"
        try:
            response = self.api_client.call_api(
                f"/api/v1/namespaces/{namespace}/pods/{pod}:{port}/proxy/{path.lstrip('/')}",
                method,
                body=body,
                header_params={"Content-Type": "application/json", "Accept": "application/json"},
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=timeout,
                _return_http_data_only=False,
            )
        except ApiException as err:
            # Non-2xx answers (the env server's JSON errors, or the proxy's own) are results too.
            return err.status, _json_object(err.body or "")
        raw, status = response[0], response[1]
        return status, _json_object(raw.data.decode() if raw.data else "")

    def kubectl(self, *args: str, check: bool = True, timeout: float = 120.0) -> str:
        out = subprocess.run(
            [self.kubectl_bin, "--kubeconfig", str(self.settings.kubeconfig), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and out.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {out.stderr.strip()}")
        return out.stdout

    def exec_python(self, namespace: str, pod: str, code: str, container: str | None = None) -> str:
        """Runs python3 -c CODE in POD (the gymkube images all carry Python)."""
        target = ["-c", container] if container else []
        return self.kubectl("exec", "-n", namespace, pod, *target, "--", "python3", "-c", code)

    # --- diagnostics -------------------------------------------------------------------------

    def dump(self, namespace: str) -> str:
        """Operator logs, events and pod descriptions, for a failed test's report."""
        ops = self.settings.operator_namespace
        sections = {
            f"gymkube resources in {namespace}": (
                "get",
                "envpools.gymkube.io,trainingruns.gymkube.io",
                "-n",
                namespace,
                "-o",
                "yaml",
            ),
            f"workloads in {namespace}": (
                "get",
                "all,pdb,configmaps",
                "-n",
                namespace,
                "-o",
                "wide",
            ),
            f"events in {namespace}": (
                "get",
                "events",
                "-n",
                namespace,
                "--sort-by=.lastTimestamp",
            ),
            f"pods in {namespace}": ("describe", "pods", "-n", namespace),
            f"operator pods in {ops}": ("describe", "pods", "-n", ops),
            "operator logs": (
                "logs",
                "-n",
                ops,
                "-l",
                f"app.kubernetes.io/instance={self.settings.release}",
                "--all-containers",
                "--prefix",
                "--tail=300",
            ),
            "operator logs (previous container)": (
                "logs",
                "-n",
                ops,
                "-l",
                f"app.kubernetes.io/instance={self.settings.release}",
                "--all-containers",
                "--previous",
                "--tail=100",
            ),
        }
        parts = []
        for title, args in sections.items():
            try:
                text = self.kubectl(*args, check=False, timeout=60)
            except subprocess.TimeoutExpired:
                text = "(kubectl timed out)"
            parts.append(f"===== {title} =====\n{text}")
        return "\n".join(parts)


# --- gymkube objects the tests create --------------------------------------------------------

POOL_LABEL = "gymkube.io/envpool"
COMPONENT_LABEL = "app.kubernetes.io/component"
ENVSERVER_PORT = 8000


def envpool_manifest(name: str, env: str, replicas: int, **spec: Any) -> Object:
    """A small EnvPool sized for a CI node: fast watchdog, canary off unless asked for."""
    body: Object = {
        "env": env,
        "replicas": replicas,
        "sessionsPerReplica": 2,
        "warmSessionsPerReplica": 1,
        "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}},
        "router": {"replicas": 1, "resources": {"requests": {"cpu": "20m", "memory": "64Mi"}}},
        "watchdog": {
            "probePeriodSeconds": 2,
            "probeTimeoutSeconds": 1,
            "failureThreshold": 3,
            "canaryIntervalSeconds": 0,
        },
    }
    body.update(spec)
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "EnvPool",
        "metadata": {"name": name},
        "spec": body,
    }


def envserver_selector(pool: str) -> str:
    return f"{POOL_LABEL}={pool},{COMPONENT_LABEL}=envserver"


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
