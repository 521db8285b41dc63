"""Process-wide state shared by the handlers (settings, the API client, the probe session), and
the one loop both kinds reconcile in: a daemon per object, woken by watch events."""

import asyncio
import contextlib
import dataclasses
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable

import aiohttp
import kopf

from gymkube_operator import metrics
from gymkube_operator.envpool.prober import AddressResolver, address_resolver
from gymkube_operator.kube import KubeClient, KubeError
from gymkube_operator.settings import OperatorSettings

logger = logging.getLogger(__name__)

RETRY_SECONDS = 5.0
"""After a failed pass (API server unreachable, a write refused, a bug) the next comes this soon."""
UNTIL_WOKEN = math.inf
"""A pass's answer when only a watch event should bring the next one."""
Pass = Callable[[], Awaitable[float | None]]
"""One level-based reconcile of one object: seconds until the next pass (UNTIL_WOKEN: none until
woken), or None when the object needs no more passes (gone, or deleted by its TTL)."""


async def reconcile_until_stopped(
    kind: str,
    what: str,
    reconcile_once: Pass,
    wake: asyncio.Event,
    stopped: kopf.DaemonStopped,
    debounce_seconds: float = 0.0,
) -> None:
    """Run passes one at a time until the daemon is stopped: the next after the delay the last one
    asked for, or at once when woken (after debounce_seconds, so a burst of events is one pass).
    A failed pass is logged and retried; it never stops the object's reconciles."""
    stopping = asyncio.create_task(_set_when_stopped(stopped, wake))
    try:
        while not stopped:
            wake.clear()
            started = time.monotonic()
            result = "ok"
            try:
                delay = await reconcile_once()
            except (KubeError, aiohttp.ClientError, TimeoutError) as error:
                logger.warning("%s: %s; retrying", what, str(error) or type(error).__name__)
                delay, result = _retry_delay(), "api_error"
            except Exception:
                logger.exception("%s: reconcile failed; retrying", what)
                delay, result = _retry_delay(), "error"
            metrics.count_pass(kind, result, time.monotonic() - started)
            if delay is None:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    wake.wait(), timeout=None if delay == UNTIL_WOKEN else max(delay, 0.1)
                )
                if debounce_seconds and not stopped:
                    await asyncio.sleep(debounce_seconds)
    finally:
        stopping.cancel()


def _retry_delay() -> float:
    # Jittered up to +50%: objects that failed together (an API server restart) retry spread out.
    return RETRY_SECONDS * random.uniform(1.0, 1.5)


async def _set_when_stopped(stopped: kopf.DaemonStopped, wake: asyncio.Event) -> None:
    # Stopping (object deleted, operator exiting) ends the wait at once, not after a whole delay.
    await stopped.wait()
    wake.set()


def namespaced(namespace: str | None) -> str:
    """The namespace kopf hands a handler: every gymkube object and child lives in one."""
    # kopf's types allow None for cluster-scoped objects.
    if namespace is None:
        raise kopf.PermanentError("gymkube objects and their children are namespaced")
    return namespace


@dataclasses.dataclass
class Runtime:
    settings: OperatorSettings
    # Tests point the watchdog at local env-server processes; else settings.probe_address_template.
    resolver: dataclasses.InitVar[AddressResolver | None] = None
    resolve: AddressResolver = dataclasses.field(init=False)
    _client: KubeClient | None = None
    _probes: aiohttp.ClientSession | None = None
    _limit: asyncio.Semaphore | None = None
    _apply_limit: asyncio.Semaphore | None = None

    def __post_init__(self, resolver: AddressResolver | None) -> None:
        self.resolve = resolver or address_resolver(self.settings.probe_address_template)

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

    @property
    def apply_limit(self) -> asyncio.Semaphore:
        if self._apply_limit is None:
            self._apply_limit = asyncio.Semaphore(self.settings.apply_concurrency)
        return self._apply_limit

    async def close(self) -> None:
        for session in (self._client, self._probes):
            if session is not None:
                await session.close()
