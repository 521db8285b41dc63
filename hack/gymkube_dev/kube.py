"""The one cluster client of the dev tooling (`make up`, `make down`, the e2e suite): the cluster
behind a kubeconfig through the kubernetes client's DynamicClient, objects as plain JSON dicts
(as kubectl shows them). kubectl itself is run only for what users read from it (describe, logs)
and for the user actions an e2e test plays (scale, exec)."""

import json
import subprocess
from functools import cached_property
from pathlib import Path

from gymkube_operator.envpool import models as envpool
from gymkube_operator.kinds import API_VERSION
from gymkube_operator.trainingrun import models as trainingrun
from kubernetes import config
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import DynamicApiError, ResourceNotFoundError
from urllib3.exceptions import HTTPError

from gymkube_dev.errors import StepError
from gymkube_dev.objects import Object
from gymkube_dev.tools import find_tool

MERGE_PATCH = "application/merge-patch+json"


class KubeError(StepError):
    """The API server did not answer, or refused a call; the message says which."""


def api_path(api: str, plural: str, namespace: str | None = None, name: str | None = None) -> str:
    """REST path of a collection or object: api is "v1" (core) or "group/version"."""
    base = "/api/v1" if api == "v1" else f"/apis/{api}"
    scope = f"/namespaces/{namespace}" if namespace else ""
    return f"{base}{scope}/{plural}" + (f"/{name}" if name else "")


PLURALS = {envpool.KIND: envpool.PLURAL, trainingrun.KIND: trainingrun.PLURAL}


def gymkube_path(plural: str, namespace: str, name: str | None = None) -> str:
    """REST path of EnvPools or TrainingRuns (PLURAL) in NAMESPACE, or of one of them."""
    return api_path(API_VERSION, plural, namespace, name)


def _json_object(payload: bytes) -> Object:
    text = payload.decode(errors="replace")
    try:
        parsed = json.loads(text) if text else {}
    except json.JSONDecodeError:
        return {"text": text}
    return parsed if isinstance(parsed, dict) else {"value": parsed}


class Kube:
    """The cluster a kubeconfig names."""

    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig
        self.api_client = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]

    @cached_property
    def dynamic(self) -> DynamicClient:
        """Made on first use: it reads the server's version, so a client for a cluster that is
        down can still be made (and asked whether it is reachable)."""
        return DynamicClient(self.api_client)  # type: ignore[no-untyped-call]

    def _unreachable(self, err: Exception) -> KubeError:
        return KubeError(
            f"the API server in {self.kubeconfig} does not answer ({type(err).__name__}); "
            "is the cluster still up?"
        )

    def raw(
        self,
        method: str,
        path: str,
        body: Object | None = None,
        *,
        query: dict[str, str] | None = None,
        content_type: str | None = None,
        accept: str = "application/json",
        timeout: float = 30.0,
    ) -> tuple[int, bytes]:
        """One API call: its status code and body as sent, error answers included."""
        try:
            response = self.dynamic.request(
                method,
                path,
                body=body,
                query_params=list((query or {}).items()),
                header_params={"Accept": accept},
                content_type=content_type or (MERGE_PATCH if method == "PATCH" else None),
                serialize=False,
                _request_timeout=timeout,
            )
        except DynamicApiError as err:
            answer = err.body or b""
            return int(err.status or 0), answer if isinstance(answer, bytes) else answer.encode()
        except (HTTPError, OSError) as err:
            raise self._unreachable(err) from err
        return int(response.status), bytes(response.data or b"")

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
        status, payload = self.raw(method, path, body, query=query, timeout=timeout)
        return status, _json_object(payload)

    def get_bytes(self, path: str, query: dict[str, str] | None = None) -> bytes | None:
        """GET PATH as it answers (a pod log, a proxied /metrics); None when it does not exist."""
        status, payload = self.raw("GET", path, query=query, accept="*/*")
        if status == 404:
            return None
        if status != 200:
            raise KubeError(f"GET {path} answered {status}: {payload[:300]!r}")
        return payload

    def get(self, path: str, query: dict[str, str] | None = None) -> Object | None:
        """GET PATH (e.g. /api/v1/nodes); None when it does not exist."""
        status, answer = self.request("GET", path, query=query)
        if status == 404:
            return None
        if status != 200:
            raise KubeError(f"GET {path} answered {status}: {answer}")
        return answer

    def list_objects(self, path: str, selector: str = "") -> list[Object]:
        """The collection's items, by name."""
        found = self.get(path, {"labelSelector": selector} if selector else None) or {}
        items: list[Object] = found.get("items") or []
        return sorted(items, key=lambda obj: str(obj["metadata"]["name"]))

    def names(self, path: str, selector: str = "") -> list[str]:
        return [str(obj["metadata"]["name"]) for obj in self.list_objects(path, selector)]

    def _ok(self, method: str, path: str, body: Object | None) -> Object:
        status, answer = self.request(method, path, body)
        if not 200 <= status < 300:
            raise KubeError(f"{method} {path} answered {status}: {answer.get('message', answer)}")
        return answer

    def create(self, path: str, body: Object) -> Object:
        return self._ok("POST", path, body)

    def patch(self, path: str, body: Object) -> Object:
        """A JSON merge patch."""
        return self._ok("PATCH", path, body)

    def delete(self, path: str, grace_period_seconds: int | None = None) -> bool:
        """Deletes PATH; False when it was not there."""
        body: Object | None = None
        if grace_period_seconds is not None:
            body = {"kind": "DeleteOptions", "apiVersion": "v1"}
            body["gracePeriodSeconds"] = grace_period_seconds
        status, answer = self.request("DELETE", path, body)
        if status not in (200, 202, 404):
            raise KubeError(f"DELETE {path} answered {status}: {answer.get('message', answer)}")
        return status != 404

    def apply(self, obj: Object, *, field_manager: str, namespace: str | None = None) -> str:
        """Server-side apply (forcing conflicts, as `kubectl apply --server-side
        --force-conflicts`); returns kubectl's line for it."""
        kind, name = obj["kind"], obj["metadata"]["name"]
        try:
            resource = self.dynamic.resources.get(api_version=obj["apiVersion"], kind=kind)
            self.dynamic.server_side_apply(  # type: ignore[no-untyped-call]
                resource,
                body=obj,
                namespace=namespace if resource.namespaced else None,
                field_manager=field_manager,
                force_conflicts=True,
            )
        except ResourceNotFoundError as err:
            raise KubeError(f"{obj['apiVersion']} {kind} is not served by this cluster") from err
        except DynamicApiError as err:
            summary = err.summary()  # type: ignore[no-untyped-call]
            raise KubeError(f"applying {kind.lower()}/{name}: {summary}") from err
        except (HTTPError, OSError) as err:
            raise self._unreachable(err) from err
        group = resource.group
        return f"{kind.lower()}{'.' + group if group else ''}/{name} serverside-applied"

    def reachable(self) -> bool:
        try:
            self.get("/api/v1/namespaces", {"limit": "1"})
        except KubeError:
            return False
        return True

    def kubectl(
        self, *args: str, check: bool = True, timeout: float = 120.0, with_stderr: bool = False
    ) -> str:
        """kubectl ARGS against this cluster; its stdout (then its stderr, WITH_STDERR).
        KubeError carrying kubectl's stderr when it fails and CHECK."""
        out = subprocess.run(
            [find_tool("kubectl"), "--kubeconfig", str(self.kubeconfig), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and out.returncode != 0:
            raise KubeError(f"kubectl {' '.join(args)} failed: {out.stderr.strip()}")
        return out.stdout + out.stderr if with_stderr else out.stdout
