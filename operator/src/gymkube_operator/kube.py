"""A small asyncio Kubernetes API client over aiohttp: server-side apply, reads, deletes, status.

kopf already logs in and speaks HTTP with aiohttp; this client reuses kopf's login result instead
of loading the official client library, which would double the operator's memory.
"""

import builtins
import json
from collections.abc import AsyncIterator
from typing import Any, Self
from urllib.parse import quote, urlencode

import aiohttp
import kopf

from gymkube_operator import metrics
from gymkube_operator.kinds import API_VERSION
from gymkube_operator.objects import Object

# (apiVersion, kind) → plural, for everything gymkube reads or writes.
PLURALS: dict[tuple[str, str], str] = {
    ("v1", "Service"): "services",
    ("v1", "Pod"): "pods",
    ("v1", "ConfigMap"): "configmaps",
    ("v1", "Event"): "events",
    ("apps/v1", "StatefulSet"): "statefulsets",
    ("apps/v1", "Deployment"): "deployments",
    ("policy/v1", "PodDisruptionBudget"): "poddisruptionbudgets",
    ("networking.k8s.io/v1", "NetworkPolicy"): "networkpolicies",
    ("batch/v1", "Job"): "jobs",
    (API_VERSION, "EnvPool"): "envpools",
    (API_VERSION, "TrainingRun"): "trainingruns",
    (API_VERSION, "EvalRun"): "evalruns",
    ("ray.io/v1", "RayJob"): "rayjobs",
    ("kueue.x-k8s.io/v1beta2", "Workload"): "workloads",
}


class KubeError(Exception):
    """The API server refused a request; the message is the server's own."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


def resource_path(
    api_version: str, kind: str, namespace: str | None, name: str | None = None
) -> str:
    """The object's path; with namespace None, the kind's in every namespace (lists, watches)."""
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    scope = "" if namespace is None else f"/namespaces/{quote(namespace)}"
    path = f"{prefix}{scope}/{PLURALS[(api_version, kind)]}"
    return f"{path}/{quote(name)}" if name else path


def _status_message(body: str) -> str:
    """The message of a Status object the API server answered with, else the body itself."""
    try:
        status = json.loads(body)
    except ValueError:
        return body
    message = status.get("message") if isinstance(status, dict) else None
    return str(message) if message else body


class KubeClient:
    def __init__(self, session: aiohttp.ClientSession, server: str, field_manager: str) -> None:
        self._session = session
        self._server = server.rstrip("/")
        self.field_manager = field_manager

    @classmethod
    def connect(cls, info: kopf.ConnectionInfo, field_manager: str) -> Self:
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=info.as_ssl_context(), limit=64),
            headers={**info.as_http_headers(), "User-Agent": field_manager},
            timeout=aiohttp.ClientTimeout(total=60),
            trace_configs=[metrics.api_request_trace()],
        )
        return cls(session, info.server, field_manager)

    async def close(self) -> None:
        await self._session.close()

    async def _request(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> Any:
        url = self._server + path + (f"?{urlencode(query)}" if query else "")
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": content_type} if data is not None else {}
        async with self._session.request(method, url, data=data, headers=headers) as response:
            if response.status >= 400:
                raise KubeError(response.status, _status_message(await response.text()))
            return await response.json(content_type=None)

    async def apply(self, obj: Object) -> Object:
        """Server-side apply, forcing conflicts: the operator owns every field it sets."""
        meta = obj["metadata"]
        path = resource_path(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])
        result: Object = await self._request(
            "PATCH",
            path,
            query={"fieldManager": self.field_manager, "force": "true"},
            body=obj,
            content_type="application/apply-patch+yaml",
        )
        return result

    async def get(self, api_version: str, kind: str, namespace: str, name: str) -> Object | None:
        try:
            result: Object = await self._request(
                "GET", resource_path(api_version, kind, namespace, name)
            )
        except KubeError as error:
            if error.status == 404:
                return None
            raise
        return result

    async def list(
        self, api_version: str, kind: str, namespace: str, selector: str = "", fields: str = ""
    ) -> list[Object]:
        """Objects matching a label selector and a field selector (either may be empty)."""
        query = {k: v for k, v in (("labelSelector", selector), ("fieldSelector", fields)) if v}
        result = await self._request(
            "GET", resource_path(api_version, kind, namespace), query=query or None
        )
        items: list[Object] = result.get("items", [])
        return items

    async def list_pages(
        self, api_version: str, kind: str, namespace: str | None, selector: str, page: int
    ) -> AsyncIterator[tuple[builtins.list[Object], str]]:
        """A list in pages of at most PAGE objects, each with the list's resourceVersion: a large
        list never has to be held whole."""
        query = {"labelSelector": selector, "limit": str(page)}
        path = resource_path(api_version, kind, namespace)
        while True:
            result = await self._request("GET", path, query=query)
            meta = result.get("metadata") or {}
            yield result.get("items") or [], str(meta.get("resourceVersion", ""))
            if not meta.get("continue"):
                return
            query["continue"] = meta["continue"]

    async def watch(
        self,
        api_version: str,
        kind: str,
        namespace: str | None,
        selector: str,
        resource_version: str,
        seconds: int,
    ) -> AsyncIterator[Object]:
        """The watch events from resource_version on, one parsed at a time, until the API server
        ends the watch (after about SECONDS) or the connection drops."""
        query = {
            "labelSelector": selector,
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(seconds),
        }
        url = self._server + resource_path(api_version, kind, namespace) + f"?{urlencode(query)}"
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=seconds + 30)
        async with self._session.get(url, timeout=timeout) as response:
            if response.status >= 400:
                raise KubeError(response.status, _status_message(await response.text()))
            pending = b""
            async for chunk in response.content.iter_any():
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield json.loads(line)

    async def get_path(self, path: str) -> Object:
        """Whatever the API server answers at a path of its own (an aggregated API's, say)."""
        result: Object = await self._request("GET", path)
        return result

    async def delete(
        self,
        api_version: str,
        kind: str,
        namespace: str,
        name: str,
        uid: str | None = None,
        grace_period_seconds: int | None = None,
        propagation_policy: str | None = None,
    ) -> bool:
        """Delete one object (only if it is still the one with this uid); False if it was gone.
        propagation_policy: Orphan, Background or Foreground (None: the kind's default)."""
        body: Object = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if uid:
            body["preconditions"] = {"uid": uid}
        if grace_period_seconds is not None:
            body["gracePeriodSeconds"] = grace_period_seconds
        if propagation_policy is not None:
            body["propagationPolicy"] = propagation_policy
        try:
            await self._request(
                "DELETE", resource_path(api_version, kind, namespace, name), body=body
            )
        except KubeError as error:
            if error.status in (404, 409):
                return False
            raise
        return True

    async def patch(
        self, api_version: str, kind: str, namespace: str, name: str, body: Object
    ) -> Object:
        """JSON merge patch of a few fields another controller may also write (e.g. suspend)."""
        result: Object = await self._request(
            "PATCH",
            resource_path(api_version, kind, namespace, name),
            body=body,
            content_type="application/merge-patch+json",
        )
        return result

    async def pod_log(self, namespace: str, pod: str, container: str, tail_lines: int) -> str:
        """The last tail_lines lines of one container's log (the kubelet's, via the API server)."""
        path = resource_path("v1", "Pod", namespace, pod) + "/log"
        query = urlencode({"container": container, "tailLines": str(tail_lines)})
        async with self._session.get(f"{self._server}{path}?{query}") as response:
            text = await response.text(errors="replace")
            if response.status >= 400:
                raise KubeError(response.status, _status_message(text))
        return text

    async def served(self, api_version: str, plural: str) -> bool:
        """Whether the API server serves this resource (its CRD is installed and established)."""
        # Discovery answers an unknown group with a plain-text 404, not a Status object.
        async with self._session.get(f"{self._server}/apis/{api_version}") as response:
            if response.status == 404:
                return False
            if response.status >= 400:
                raise KubeError(response.status, await response.text())
            group = await response.json(content_type=None)
        return any(r.get("name") == plural for r in group.get("resources", []))

    async def patch_status(
        self, api_version: str, kind: str, namespace: str, name: str, status: Object
    ) -> Object:
        result: Object = await self._request(
            "PATCH",
            resource_path(api_version, kind, namespace, name) + "/status",
            body={"status": status},
            content_type="application/merge-patch+json",
        )
        return result
