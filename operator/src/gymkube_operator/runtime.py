"""Process-wide state shared by the handlers: settings, the API client, the probe session."""

import asyncio
import dataclasses

import aiohttp
import kopf

from gymkube_operator.envpool.prober import AddressResolver, pod_address
from gymkube_operator.kube import KubeClient
from gymkube_operator.settings import OperatorSettings


def namespaced(namespace: str | None) -> str:
    """The namespace kopf hands a handler: every gymkube object and child lives in one."""
    # kopf's types allow None for cluster-scoped objects.
    if namespace is None:
        raise kopf.PermanentError("gymkube objects and their children are namespaced")
    return namespace


@dataclasses.dataclass
class Runtime:
    settings: OperatorSettings
    resolve: AddressResolver = pod_address
    _client: KubeClient | None = None
    _probes: aiohttp.ClientSession | None = None
    _limit: asyncio.Semaphore | None = None

    async def connect(self, info: kopf.ConnectionInfo) -> None:
        """Called from the login handler (again when credentials expire), so the client always
        uses the credentials kopf uses."""
        previous, self._client = self._client, KubeClient.connect(info, self.settings.field_manager)
        if previous is not None:
            await previous.close()

    @property
    def client(self) -> KubeClient:
        if self._client is None:
            raise kopf.TemporaryError("not logged in to the API server yet", delay=1)
        return self._client

    @property
    def probes(self) -> aiohttp.ClientSession:
        if self._probes is None:
            self._probes = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.settings.probe_concurrency)
            )
        return self._probes

    @property
    def probe_limit(self) -> asyncio.Semaphore:
        if self._limit is None:
            self._limit = asyncio.Semaphore(self.settings.probe_concurrency)
        return self._limit

    async def close(self) -> None:
        for session in (self._client, self._probes):
            if session is not None:
                await session.close()
