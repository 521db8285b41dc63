"""The canary: a periodic short episode (reset and one step) on a spare env."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from gymkube_envserver.env_pool import describe_failure
from gymkube_envserver.envs.base import ResetParams
from gymkube_envserver.sessions import SessionManager
from gymkube_envserver.wire import CanaryStatus

log = logging.getLogger(__name__)


class Canary:
    def __init__(self, manager: SessionManager, interval_s: float, timeout_s: float) -> None:
        self.manager = manager
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.status = CanaryStatus()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.interval_s > 0:
            self._task = asyncio.create_task(self._loop(), name="canary")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def run_once(self) -> CanaryStatus:
        began = time.perf_counter()
        error: str | None = None
        try:
            await asyncio.wait_for(self._episode(), timeout=self.timeout_s)
        except TimeoutError:
            error = f"canary episode took over {self.timeout_s:g} s"
        except Exception as exc:
            error = describe_failure(exc)
        latency_ms = (time.perf_counter() - began) * 1000
        if error:
            log.warning("canary failed after %.0f ms: %s", latency_ms, error)
        self.status = CanaryStatus(
            ok=error is None, latency_ms=round(latency_ms, 3), at=time.time(), error=error
        )
        return self.status

    async def _episode(self) -> None:
        async with self.manager.borrowed_spare() as instance:
            # The server's default env_config: the canary plays the episodes sessions get.
            default = self.manager.settings.env_config
            await instance.reset(ResetParams(data_idx=0, seed=None, env_config=default))
            await instance.step(self.manager.backend.canary_action)

    async def _loop(self) -> None:
        await self.manager.warmed_event.wait()
        while True:
            if not self.manager.draining:
                await self.run_once()
            await asyncio.sleep(self.interval_s)
