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

from gymkube_operator.labels import COMPONENT_LABEL, POOL_LABEL
from kubernetes import config
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
    pod_start_timeout_s: float = Field(180.0, description="A replaced env pod becoming Ready.")

    def image(self, component: str) -> str:
        return f"gymkube/{component}:{self.image_tag}"

    @property
    def preflight_image(self) -> str:
        """The image with gymkube-preflight, as the operator's preflight Jobs use."""
        return self.image("preflight")


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


def api_path(api: str, plural: str, namespace: str | None = None, name: str | None = None) -> str:
    """REST path of a collection or object: api is "v1" (core) or "group/version"."""
    base = "/api/v1" if api == "v1" else f"/apis/{api}"
    scope = f"/namespaces/{namespace}" if namespace else ""
    return f"{base}{scope}/{plural}" + (f"/{name}" if name else "")


def gymkube_path(plural: str, namespace: str, name: str | None = None) -> str:
    return api_path(f"{GROUP}/{VERSION}", plural, namespace, name)


def is_ready(pod: Object) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    return ready and not pod["metadata"].get("deletionTimestamp")


class Cluster:
    """The cluster the kubeconfig names, spoken to in plain JSON objects (as kubectl shows them)."""

    def __init__(self, settings: E2ESettings) -> None:
        self.settings = settings
        self.api_client = config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=str(settings.kubeconfig)
        )
        self.kubectl_bin = find_tool("kubectl")

    def request(
        self,
        method: str,
        path: str,
        body: Object | None = None,
        *,
        query: dict[str, str] | None = None,
        timeout: float = 30.0,
    ) -> tuple[int, Object]:
        """One API call; the status code and the JSON body, error answers included."""
        content_type = "application/merge-patch+json" if method == "PATCH" else "application/json"
        prepared = self.api_client.param_serialize(
            method=method,
            resource_path=path,
            query_params=list((query or {}).items()),
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
        )
        url, headers, payload = prepared[1], prepared[2], prepared[3]
        try:
            response = self.api_client.call_api(
                method, url, header_params=headers, body=payload, _request_timeout=timeout
            )
        except ApiException as err:
            return int(err.status or 0), _json_object(err.body or "")
        return int(response.status), _json_object(response.read() or b"")

    def _ok(self, method: str, path: str, body: Object | None = None) -> Object:
        status, answer = self.request(method, path, body)
        if not 200 <= status < 300:
            raise AssertionError(f"{method} {path} answered {status}: {answer}")
        return answer

    def get(self, path: str) -> Object | None:
        status, answer = self.request("GET", path)
        if status == 404:
            return None
        if status != 200:
            raise AssertionError(f"GET {path} answered {status}: {answer}")
        return answer

    def list_objects(self, path: str, selector: str = "") -> list[Object]:
        status, answer = self.request("GET", path, query={"labelSelector": selector})
        if status != 200:
            raise AssertionError(f"GET {path}?labelSelector={selector} answered {status}: {answer}")
        items: list[Object] = answer.get("items") or []
        return sorted(items, key=lambda obj: str(obj["metadata"]["name"]))

    def names(self, path: str, selector: str = "") -> list[str]:
        return [str(obj["metadata"]["name"]) for obj in self.list_objects(path, selector)]

    def create(self, path: str, body: Object) -> Object:
        return self._ok("POST", path, body)

    def delete(self, path: str, grace_period_seconds: int | None = None) -> None:
        body: Object | None = None
        if grace_period_seconds is not None:
            body = {"kind": "DeleteOptions", "apiVersion": "v1"}
            body["gracePeriodSeconds"] = grace_period_seconds
        status, answer = self.request("DELETE", path, body)
        if status not in (200, 202, 404):
            raise AssertionError(f"DELETE {path} answered {status}: {answer}")

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
