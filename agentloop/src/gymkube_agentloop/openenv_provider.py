"""gymkube as OpenEnv's Kubernetes provider: OpenEnv's own client starts an image as an EnvPool.

    from openenv.core.generic_client import GenericEnvClient
    from gymkube_agentloop.openenv_provider import GymkubeProvider

    with GenericEnvClient.from_docker_image("registry.example/sudoku:1",
                                            provider=GymkubeProvider()).sync() as env:
        env.reset()

``start_container`` creates an EnvPool (``env: openenv`` with the image, or a built-in env for
``gymkube:<env>`` such as ``gymkube:frozen_lake``), waits until it is Ready and returns a URL the
caller can reach: the pool URL inside the cluster, outside it a local port that the provider
forwards to the pool's routers through the API server (no kubectl needed). A pool that cannot
come up fails with the operator's own words (``ImagePullFailed: ...``), never a bare timeout.
``stop_container`` deletes the pool it made, and only that one.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import re
import secrets
import socket
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import kubernetes
from kubernetes.client.exceptions import ApiException
from kubernetes.stream import portforward
from openenv.core.containers.runtime.providers import ContainerProvider

log = logging.getLogger(__name__)

GROUP, VERSION, PLURAL, KIND = "gymkube.io", "v1alpha1", "envpools", "EnvPool"
BUILTIN_PREFIX = "gymkube:"
"""``gymkube:frozen_lake`` starts gymkube's own env server for that env, not an image."""
OPENENV_ENV = "openenv"
ENVSERVER_CONTAINER = "envserver"
"""The env-server container the operator renders (gymkube_operator.envpool.builders; a test
holds the two equal): env_vars go to it."""
STUCK_REASONS = frozenset(
    {
        "ApplyFailed",
        "RestartBudgetExhausted",
        "Unschedulable",
        "ImagePullFailed",
        "ContainerCreateFailed",
        "OutOfMemory",
        "StartupProbeFailing",
        "ServerCrashLoop",
    }
)
"""Degraded reasons that waiting does not fix (gymkube_operator.envpool.reasons.STUCK; a test
holds the two equal): the provider gives up on them at once."""
CREATED_BY = {"app.kubernetes.io/created-by": "gymkube-openenv-provider"}
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
NAME_LIMIT = 40
POLL_S = 1.0
PUMP_BYTES = 65536


class PoolFailed(RuntimeError):
    """The pool will not become Ready without a change (its Degraded condition says why)."""


def pool_name(image: str) -> str:
    """A fresh DNS-1035 name for the pool of ``image``: its last path part, then a suffix."""
    stem = image.removeprefix(BUILTIN_PREFIX).rsplit("/", 1)[-1].split("@")[0]
    stem = re.sub(r"[^a-z0-9]+", "-", stem.split(":")[0].lower()).strip("-")
    stem = stem.lstrip("0123456789-")[:NAME_LIMIT].rstrip("-") or "env"
    return f"openenv-{stem}-{secrets.token_hex(3)}"


def pool_manifest(
    name: str,
    image: str,
    *,
    port: int | None = None,
    env_vars: dict[str, str] | None = None,
    replicas: int = 1,
    sessions_per_replica: int = 8,
    env_config: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The EnvPool ``start_container`` creates: the image as an OpenEnv server, or a built-in
    env."""
    spec: dict[str, Any] = {"replicas": replicas, "sessionsPerReplica": sessions_per_replica}
    if image.startswith(BUILTIN_PREFIX):
        spec["env"] = image.removeprefix(BUILTIN_PREFIX)
    else:
        spec |= {"env": OPENENV_ENV, "image": image}
    if port is not None:
        spec["port"] = port
    if env_config:
        spec["envConfig"] = env_config
    if env_vars:
        env = [{"name": key, "value": value} for key, value in env_vars.items()]
        spec["podTemplate"] = {"containers": [{"name": ENVSERVER_CONTAINER, "env": env}]}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {"name": name, "labels": CREATED_BY},
        "spec": spec,
    }


def _condition(pool: dict[str, Any], kind: str) -> dict[str, Any]:
    for condition in pool.get("status", {}).get("conditions", []):
        if condition.get("type") == kind:
            return dict(condition)
    return {}


def readiness(pool: dict[str, Any]) -> tuple[bool, str]:
    """(Ready for this generation, what its conditions say); raises PoolFailed on a stuck pool."""
    name = f"EnvPool {pool['metadata'].get('namespace', '')}/{pool['metadata']['name']}"
    generation = pool["metadata"].get("generation", 1)
    if pool.get("status", {}).get("observedGeneration", 0) < generation:
        return False, f"{name}: the operator has not acted on it yet (is gymkube installed?)"
    ready, degraded = _condition(pool, "Ready"), _condition(pool, "Degraded")
    if degraded.get("status") == "True" and degraded.get("reason") in STUCK_REASONS:
        raise PoolFailed(f"{name} is {degraded['reason']}: {degraded.get('message', '')}")
    said = f"{name}: {ready.get('reason', 'NoStatus')}: {ready.get('message', '')}"
    if degraded.get("status") == "True":
        said += f"; {degraded.get('reason')}: {degraded.get('message', '')}"
    return ready.get("status") == "True", said


def in_a_cluster() -> bool:
    return "KUBERNETES_SERVICE_HOST" in os.environ and (SERVICE_ACCOUNT / "token").exists()


class PortForwarder:
    """127.0.0.1:<free port> to the pods behind a Service, one API-server port-forward per TCP
    connection; each connection picks a ready pod anew, so a restarted router is found again."""

    def __init__(self, core: kubernetes.client.CoreV1Api, namespace: str, service: str) -> None:
        self._core, self._namespace, self._service = core, namespace, service
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._closed = threading.Event()
        threading.Thread(target=self._accept, name=f"forward-{service}", daemon=True).start()

    def close(self) -> None:
        self._closed.set()
        self._listener.close()

    def _target(self) -> tuple[str, int]:
        client = self._core.api_client
        service = plain(client, self._core.read_namespaced_service(self._service, self._namespace))
        selector = ",".join(f"{k}={v}" for k, v in sorted(service["spec"]["selector"].items()))
        target = service["spec"]["ports"][0]["targetPort"]
        listed = self._core.list_namespaced_pod(self._namespace, label_selector=selector)
        pods = [pod for pod in plain(client, listed)["items"] if _serving(pod)]
        if not pods:
            raise ConnectionError(f"no ready pod behind Service {self._namespace}/{self._service}")
        pod = random.choice(pods)
        if isinstance(target, str):
            containers = pod["spec"]["containers"]
            named = [p for c in containers for p in c.get("ports", []) if p.get("name") == target]
            target = named[0]["containerPort"]
        return str(pod["metadata"]["name"]), int(target)

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                pod, port = self._target()
                forward = portforward(
                    self._core.connect_get_namespaced_pod_portforward,
                    pod,
                    self._namespace,
                    ports=str(port),
                )
            except (ApiException, ConnectionError, OSError) as exc:
                log.warning("gymkube provider: cannot forward to %s: %s", self._service, exc)
                return
            remote = forward.socket(port)
            back = threading.Thread(target=_pump, args=(remote, conn), daemon=True)
            back.start()
            _pump(conn, remote)
            back.join()
            forward.close()


def plain(client: kubernetes.client.ApiClient, obj: object) -> dict[str, Any]:
    """An API object as the JSON the API server sent (camelCase keys, as kubectl shows it)."""
    serialized: dict[str, Any] = client.sanitize_for_serialization(obj)  # type: ignore[no-untyped-call]
    return serialized


def _serving(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions", [])
    ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
    return ready and "deletionTimestamp" not in pod["metadata"]


def _pump(source: socket.socket, sink: socket.socket) -> None:
    """Copy until source ends, then end sink's sending side (the other direction goes on)."""
    with contextlib.suppress(OSError):
        while data := source.recv(PUMP_BYTES):
            sink.sendall(data)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


class GymkubeProvider(ContainerProvider):  # type: ignore[misc]  # OpenEnv ships no type information
    """OpenEnv's ``ContainerProvider`` backed by a gymkube EnvPool (one pool per provider)."""

    def __init__(
        self,
        namespace: str | None = None,
        *,
        image: str | None = None,
        replicas: int = 1,
        sessions_per_replica: int = 8,
        ready_timeout_s: float = 600.0,
        in_cluster: bool | None = None,
        api_client: kubernetes.client.ApiClient | None = None,
    ) -> None:
        """namespace: where pools go (default: this pod's namespace in a cluster, else the
        kubeconfig context's, else ``default``). image: what ``start_container()`` starts when
        called without one, as OpenEnv's ``EnvClient(provider=...)`` does. replicas,
        sessions_per_replica: the pool's size (``start_container`` kwargs override them).
        ready_timeout_s: how long ``start_container`` waits for the pool to be Ready.
        in_cluster: return the in-cluster pool URL rather than a forwarded local port (default:
        whether this process runs in a pod)."""
        self.in_cluster = in_a_cluster() if in_cluster is None else in_cluster
        if api_client is None:
            if in_a_cluster():
                kubernetes.config.load_incluster_config()  # type: ignore[no-untyped-call]
            else:
                kubernetes.config.load_kube_config()  # type: ignore[no-untyped-call]
            api_client = kubernetes.client.ApiClient()
        self._client = api_client
        self.namespace = namespace or _default_namespace()
        self.image = image
        self.replicas, self.sessions_per_replica = replicas, sessions_per_replica
        self.ready_timeout_s = ready_timeout_s
        self.pool: str | None = None
        self._forwarder: PortForwarder | None = None
        self._custom = kubernetes.client.CustomObjectsApi(api_client)
        self._core = kubernetes.client.CoreV1Api(api_client)

    def start_container(
        self,
        image: str | None = None,
        port: int | None = None,
        env_vars: dict[str, str] | None = None,
        **kwargs: Any,
    ) -> str:
        """Create the pool, wait until it is Ready, return its URL.

        kwargs: ``replicas``, ``sessions_per_replica``, ``env_config`` (a built-in env's config),
        ``name`` (the pool's name; default ``openenv-<image>-<random>``)."""
        if self.pool is not None:
            raise RuntimeError(f"this provider already runs EnvPool {self.pool}; stop it first")
        image = image or self.image
        if not image:
            raise ValueError("GymkubeProvider.start_container: no image (pass one, or image=...)")
        unknown = set(kwargs) - {"replicas", "sessions_per_replica", "env_config", "name"}
        if unknown:
            raise TypeError(f"GymkubeProvider.start_container: unknown options {sorted(unknown)}")
        name = kwargs.get("name") or pool_name(image)
        manifest = pool_manifest(
            name,
            image,
            port=port,
            env_vars=env_vars,
            replicas=kwargs.get("replicas", self.replicas),
            sessions_per_replica=kwargs.get("sessions_per_replica", self.sessions_per_replica),
            env_config=kwargs.get("env_config"),
        )
        try:
            self._custom.create_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, manifest
            )
        except ApiException as exc:
            raise RuntimeError(f"EnvPool {self.namespace}/{name}: {_api_message(exc)}") from None
        self.pool = name
        log.info("gymkube provider: created EnvPool %s/%s for %s", self.namespace, name, image)
        url = self._wait_ready(name)
        if self.in_cluster:
            return url
        self._forwarder = PortForwarder(self._core, self.namespace, name)
        return f"http://127.0.0.1:{self._forwarder.port}"

    def _wait_ready(self, name: str) -> str:
        deadline = time.monotonic() + self.ready_timeout_s
        said = f"EnvPool {self.namespace}/{name}: not read yet"
        while time.monotonic() < deadline:
            pool = plain(
                self._client,
                self._custom.get_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, PLURAL, name
                ),
            )
            ready, said = readiness(pool)
            if ready:
                return str(pool["status"]["url"])
            time.sleep(POLL_S)
        raise TimeoutError(f"not Ready after {self.ready_timeout_s:g} s: {said}")

    def wait_for_ready(self, base_url: str, timeout_s: float = 30.0) -> None:
        """Until the pool answers OpenEnv's ``/health`` (the pool is Ready by now)."""
        deadline = time.monotonic() + timeout_s
        last = "no answer yet"
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{base_url}/health", timeout=5) as response:
                    if response.status == 200:
                        return
                    last = f"HTTP {response.status}"
            except (urllib.error.URLError, OSError) as exc:
                last = str(exc)
            time.sleep(POLL_S)
        raise TimeoutError(f"{base_url}/health did not answer in {timeout_s:g} s: {last}")

    def stop_container(self) -> None:
        """Delete the pool this provider created (its children go with it); nothing else."""
        if self._forwarder is not None:
            self._forwarder.close()
            self._forwarder = None
        if self.pool is None:
            return
        try:
            self._custom.delete_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, self.pool
            )
        except ApiException as exc:
            if exc.status != 404:
                message = _api_message(exc)
                raise RuntimeError(f"EnvPool {self.namespace}/{self.pool}: {message}") from None
        log.info("gymkube provider: deleted EnvPool %s/%s", self.namespace, self.pool)
        self.pool = None

    def close(self) -> None:
        self.stop_container()
        self._client.close()  # type: ignore[no-untyped-call]


def _default_namespace() -> str:
    if in_a_cluster():
        return (SERVICE_ACCOUNT / "namespace").read_text().strip()
    with contextlib.suppress(kubernetes.config.ConfigException, KeyError, TypeError):
        _, active = kubernetes.config.list_kube_config_contexts()  # type: ignore[no-untyped-call]
        return str(active["context"].get("namespace") or "default")
    return "default"


def _api_message(exc: ApiException) -> str:
    """The API server's own message (e.g. a CRD validation rule), not the HTTP dump."""
    with contextlib.suppress(ValueError, TypeError):
        return str(json.loads(exc.body or "").get("message") or exc.reason)
    return f"{exc.status} {exc.reason}"
