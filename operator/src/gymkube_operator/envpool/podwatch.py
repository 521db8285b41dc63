"""The pools' pods, as the watchdog reads them, from a list+watch of the operator's own.

Only pods with the pool label come (a server-side selector: a cluster's other pods never reach the
operator), each slimmed to what the watchdog reads the moment it is parsed (envpool.pods.slim_pod),
and the first list is read in pages. Through kopf every pod event was a full body queued for a
per-object worker; during a 1,000-pool ramp those queues held the peak of the operator's memory.
"""

import asyncio
import logging
from collections.abc import Callable

import kopf

from gymkube_operator.envpool.builders import ENVSERVER, ROUTER
from gymkube_operator.envpool.pods import slim_pod
from gymkube_operator.kube import KubeClient, KubeError
from gymkube_operator.labels import COMPONENT_LABEL, POOL_LABEL
from gymkube_operator.objects import Object

logger = logging.getLogger(__name__)

SELECTOR = f"{POOL_LABEL},{COMPONENT_LABEL} in ({ENVSERVER},{ROUTER})"
LIST_PAGE = 500
WATCH_SECONDS = 300
RETRY_SECONDS = 1.0
GONE = 410  # the resourceVersion a watch asked for is compacted away: list again

# (namespace, pool, component) → pod uid → slim pod
Shelf = dict[tuple[str, str, str], dict[str, Object]]


class PoolPods:
    """Every pool's env-server and router pods; `synced` once each watched scope was listed."""

    def __init__(self, scopes: list[str | None]) -> None:
        self.scopes = scopes
        self._shelves: dict[str | None, Shelf] = {scope: {} for scope in scopes}
        self._listed: set[str | None] = set()
        self.synced = asyncio.Event()

    def servers(self, namespace: str, pool: str) -> list[Object]:
        return self._find(namespace, pool, ENVSERVER)

    def routers(self, namespace: str, pool: str) -> list[Object]:
        return self._find(namespace, pool, ROUTER)

    def _find(self, namespace: str, pool: str, component: str) -> list[Object]:
        scope = namespace if namespace in self._shelves else None
        return list(self._shelves.get(scope, {}).get((namespace, pool, component), {}).values())

    def seen(self, scope: str | None, event_type: str, pod: Object) -> None:
        """One watch event (ADDED, MODIFIED, DELETED) of a pod in SCOPE."""
        shelve(self._shelves[scope], event_type, pod)

    def listed(self, scope: str | None, shelf: Shelf) -> None:
        """A fresh list of SCOPE's pods replaces what was known of it."""
        self._shelves[scope] = shelf
        self._listed.add(scope)
        if self._listed.issuperset(self.scopes):
            self.synced.set()

    async def follow(self, client: Callable[[], KubeClient], scope: str | None) -> None:
        """List SCOPE (a namespace, or None for all), then watch it, listing again whenever the
        watch cannot go on from where it was; runs until cancelled."""
        version: str | None = None
        while True:
            try:
                if version is None:
                    version = await self._list(client(), scope)
                version = await self._watch(client(), scope, version)
            except (KubeError, kopf.TemporaryError, OSError, TimeoutError, ValueError) as error:
                if not isinstance(error, kopf.TemporaryError):  # not logged in yet: quiet
                    logger.warning("watching pods in %s: %s", scope or "all namespaces", error)
                if isinstance(error, KubeError) and error.status == GONE:
                    version = None
                await asyncio.sleep(RETRY_SECONDS)

    async def _list(self, client: KubeClient, scope: str | None) -> str:
        shelf: Shelf = {}
        version = ""
        async for page, listed_at in client.list_pages("v1", "Pod", scope, SELECTOR, LIST_PAGE):
            # Slimmed at once: a page's full bodies are dropped before the next is read.
            for pod in page:
                shelve(shelf, "ADDED", pod)
            version = listed_at
        self.listed(scope, shelf)
        return version

    async def _watch(self, client: KubeClient, scope: str | None, version: str) -> str | None:
        """Follows the watch until it ends; the resourceVersion to go on from (None: list)."""
        async for event in client.watch("v1", "Pod", scope, SELECTOR, version, WATCH_SECONDS):
            kind, pod = event.get("type"), event.get("object") or {}
            if kind == "ERROR":
                code = pod.get("code")
                logger.info(
                    "pod watch in %s ended: %s", scope or "all namespaces", pod.get("message")
                )
                return None if code == GONE else version
            version = pod.get("metadata", {}).get("resourceVersion", version)
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                self.seen(scope, kind, pod)
        return version


def shelve(shelf: Shelf, event_type: str, pod: Object) -> None:
    meta = pod["metadata"]
    labels = meta.get("labels") or {}
    key = (meta["namespace"], labels.get(POOL_LABEL, ""), labels.get(COMPONENT_LABEL, ""))
    if event_type == "DELETED":
        pods = shelf.get(key, {})
        pods.pop(meta["uid"], None)
        if not pods:
            shelf.pop(key, None)
    else:
        shelf.setdefault(key, {})[meta["uid"]] = slim_pod(pod)
