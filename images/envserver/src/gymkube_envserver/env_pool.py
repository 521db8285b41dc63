"""The env pool: started envs that no session holds, their reuse, recycling and refill.

An env outlives its session: a clean close gives it back here for the next /create (whose /reset
loads that session's task), and only an env that failed, served its episode quota or grew past the
memory bound is closed. An env the pool closes for one of those reasons is replaced in the
background, so the pool holds all idle capacity, not only ``--warm`` envs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gymkube_envserver.envs.base import EnvBackend, EnvInstance
from gymkube_envserver.settings import ServerSettings

log = logging.getLogger(__name__)

WARM_RETRY_S = 2.0
REFILL_DEFER_S = 5.0
REFILL_POLL_S = 0.05
MIB = 1024 * 1024


class EnvRetired(StrEnum):
    """Why an env was closed instead of going back to the pool."""

    FAILED = "failed"
    """A call on it raised, timed out, or its process died."""
    EPISODES = "episodes"
    """It served ``--recycle-after-episodes`` episodes."""
    MEMORY = "memory"
    """Its process grew past ``--recycle-rss-mib``."""
    NOT_REUSED = "not_reused"
    """Reuse is off, the env kind declares itself not reusable, or the canary started it."""
    DRAINING = "draining"
    """The server is draining or shutting down."""


REPLACED = frozenset({EnvRetired.FAILED, EnvRetired.EPISODES, EnvRetired.MEMORY})
"""Retirements of envs that would otherwise have gone back to the pool: the pool starts a
replacement in the background."""
RECYCLED = frozenset({EnvRetired.EPISODES, EnvRetired.MEMORY})
"""Retirements of healthy envs that reached a recycling bound."""


@dataclass(eq=False)
class PooledEnv:
    """A started env and its history; it serves one session at a time, many over its life."""

    instance: EnvInstance
    env_config: dict[str, Any]
    """The env_config it was started with (plugins take it in their constructor)."""
    sessions: int = 0
    episodes: int = 0
    """Resets played on it, by sessions and the canary."""
    failed: str | None = None
    """Why it must never be handed out again."""
    warmed: bool = False
    """It has run the instance's warm_up (pre-started envs do before joining the pool)."""


def describe_failure(exc: BaseException) -> str:
    text = str(exc).strip() or "no message"
    return f"{type(exc).__name__}: {text[:500]}"


class EnvPool:
    """Idle started envs (``warm``), those on their way back, and the task that refills them.

    ``sessions_need_cpu`` says whether new sessions are resetting: the refill waits for them.
    """

    def __init__(
        self, backend: EnvBackend, settings: ServerSettings, sessions_need_cpu: Callable[[], bool]
    ) -> None:
        self.backend = backend
        self.settings = settings
        self.warm: deque[PooledEnv] = deque()
        """Idle started envs, oldest first: pre-started ones and those sessions gave back."""
        self.envs_started = 0
        self.envs_retired: Counter[EnvRetired] = Counter()
        self.draining = False
        self.prepared = False
        self.warmed_event = asyncio.Event()
        self._sessions_need_cpu = sessions_need_cpu
        self._lent = 0  # warm envs the canary has borrowed (they come back)
        self._refill = asyncio.Event()
        self._replacements = 0  # retired envs the pool still has to replace
        self._warming = 0  # given-back envs warming up before they rejoin the pool
        self._returned = asyncio.Event()  # set (and replaced) whenever an env may have come back
        self._closing: set[asyncio.Task[None]] = set()

    @property
    def warmed(self) -> bool:
        """The warm pool has been full at least once."""
        return self.warmed_event.is_set()

    def set_draining(self, draining: bool) -> None:
        self.draining = draining
        if not draining:
            self._refill.set()

    async def close_all(self, timeout_s: float) -> None:
        """Close every idle env and wait (up to ``timeout_s``) for the envs being closed."""
        self.draining = True  # envs given back from now on are closed, not kept
        while self.warm:
            self.retire(self.warm.popleft(), EnvRetired.DRAINING)
        if self._closing:
            # A hung env call holds its session's lock; do not let it hold up the shutdown.
            await asyncio.wait(set(self._closing), timeout=timeout_s)

    # taking and giving back

    def take_idle(self, env_config: dict[str, Any]) -> PooledEnv | None:
        """The oldest idle env that can serve a session with ``env_config``, out of the pool."""
        for env in self.warm:
            # Plugins take env_config in their constructor; every built-in env at reset.
            if self.backend.config_at_reset or env.env_config == env_config:
                self.warm.remove(env)
                self._refill.set()
                return env
        return None

    async def take_idle_or_returning(self, env_config: dict[str, Any]) -> PooledEnv | None:
        """An idle env, waiting for one that is warming up on its way back if need be: it is
        ready sooner than a new one, and a new one would grow the pool past its size."""
        env = self.take_idle(env_config)
        while env is None and self._warming:
            await self._returned.wait()
            env = self.take_idle(env_config)
        return env

    async def start_for_session(self, env_config: dict[str, Any]) -> PooledEnv:
        """A new env for a session that found the pool empty; it also stands in for one the pool
        owed in place of a retired env. Raises what the backend's start raises."""
        self._replacements = max(0, self._replacements - 1)
        return await self._start_env(env_config)

    def give_back(self, env: PooledEnv, from_session: bool = True) -> None:
        """An env no session or canary uses any more: back to the pool, or closed and why."""
        reason = self.retire_reason(env, from_session)
        if reason is None and not env.warmed and env.instance.warms_up():
            self._warming += 1  # counted now: a /create may come before the task runs
            self.track(asyncio.create_task(self._warm_up_and_give_back(env), name="warm-up-env"))
            return
        if reason is None:
            self.warm.append(env)
            self._announce_return()
            return
        if reason in REPLACED and self._keeps_envs(from_session):
            self._replacements += 1
        self.retire(env, reason)

    def trade(self, worn: PooledEnv, env_config: dict[str, Any]) -> PooledEnv | None:
        """An idle env in place of ``worn``, which a session holds and which has reached a
        recycling bound; ``worn`` is closed. None (and nothing changes) when none is idle."""
        reason = self.due_for_recycling(worn)
        fresh = self.take_idle(env_config) if reason is not None else None
        if reason is None or fresh is None:
            return None
        if self._idle() >= self.settings.warm:
            self._replacements += 1  # the refill to --warm would not start one in its place
        self.retire(worn, reason)
        return fresh

    def due_for_recycling(self, env: PooledEnv) -> EnvRetired | None:
        """EPISODES or MEMORY when the env has reached a recycling bound, else None."""
        quota = self.settings.recycle_after_episodes
        if quota and env.episodes >= quota:
            return EnvRetired.EPISODES
        bound = self.settings.recycle_rss_mib
        rss = env.instance.rss_bytes() if bound else None
        if rss is not None and rss > bound * MIB:
            return EnvRetired.MEMORY
        return None

    def retire_reason(self, env: PooledEnv, from_session: bool) -> EnvRetired | None:
        if env.failed is not None:
            return EnvRetired.FAILED
        if self.draining:
            return EnvRetired.DRAINING
        if not self._keeps_envs(from_session):
            return EnvRetired.NOT_REUSED
        return self.due_for_recycling(env)

    def retire(self, env: PooledEnv, reason: EnvRetired) -> None:
        """Close the env in the background and let the pool refill."""
        self.envs_retired[reason] += 1
        log.debug("closing an env (%s) after %d episodes", reason.value, env.episodes)
        self.track(asyncio.create_task(env.instance.close(), name="close-env"))
        self._refill.set()

    def track(self, task: asyncio.Task[None]) -> None:
        """Keep a background task on an env until it is done (shutdown waits for it)."""
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    @contextlib.asynccontextmanager
    async def borrowed_spare(self) -> AsyncIterator[EnvInstance]:
        """A started env outside any session, for the canary.

        An idle env used without error goes back to the pool (a canary then costs no env
        start, which for ScienceWorld is a JVM and its warm-up); any other is closed.
        """
        env = self.take_idle(self.settings.env_config)
        from_pool = env is not None
        if env is None:
            env = await self._start_env(self.settings.env_config)
        else:
            self._lent += 1
        try:
            yield env.instance
        except BaseException:
            env.failed = "the canary failed on it"
            raise
        finally:
            env.episodes += 1
            if from_pool:
                self._lent -= 1
                self.give_back(env, from_session=False)
            else:
                # Started for the canary alone: not idle capacity the pool should keep.
                failed = env.failed is not None
                self.retire(env, EnvRetired.FAILED if failed else EnvRetired.NOT_REUSED)

    # internals

    def _keeps_envs(self, from_session: bool) -> bool:
        """Whether an env given back goes to the pool: reuse is on and the env kind allows it.
        --reuse is about sessions: the canary's idle env goes back either way."""
        return self.backend.reusable and (self.settings.reuse or not from_session)

    async def _warm_up_and_give_back(self, env: PooledEnv) -> None:
        """An env a session started cold runs the warm-up the pool's own envs ran, once, so it
        serves later sessions as fast as they do (it is idle capacity from now on)."""
        try:
            await env.instance.warm_up()
            env.warmed = True
        except Exception:
            log.exception("warming up a given-back env failed")
            env.failed = "its warm-up failed"
        finally:
            self._warming -= 1
        self.give_back(env)
        self._announce_return()

    def _announce_return(self) -> None:
        self._returned.set()
        self._returned = asyncio.Event()

    async def _start_env(self, env_config: dict[str, Any]) -> PooledEnv:
        instance = await self.backend.start(env_config)
        self.envs_started += 1
        return PooledEnv(instance=instance, env_config=env_config)

    async def prepare_and_fill(self) -> None:
        """Prepare the backend, then keep the pool at ``--warm`` idle envs plus replacements."""
        while not self.prepared:
            try:
                await self.backend.prepare()
                self.prepared = True
            except Exception:
                log.exception("preparing the env failed; retrying")
                await asyncio.sleep(WARM_RETRY_S)
        while True:
            while self._short():
                await self._yield_to_resets()
                if not self._short():
                    break  # a canary or a session gave its env back meanwhile
                env: PooledEnv | None = None
                try:
                    env = await self._start_env(self.settings.env_config)
                    await env.instance.warm_up()
                except Exception:
                    log.exception("starting a warm env failed; retrying")
                    if env is not None:
                        env.failed = "its warm-up failed"
                        self.retire(env, EnvRetired.FAILED)
                    await asyncio.sleep(WARM_RETRY_S)
                    continue
                env.warmed = True
                if self._idle() >= self.settings.warm:
                    self._replacements = max(0, self._replacements - 1)
                self.warm.append(env)
                self._announce_return()
            if len(self.warm) + self._lent >= self.settings.warm:
                self.warmed_event.set()
            self._refill.clear()
            await self._refill.wait()

    def _idle(self) -> int:
        """Idle envs, counting those the canary has borrowed or that are warming up on their
        way back."""
        return len(self.warm) + self._lent + self._warming

    def _short(self) -> bool:
        """Fewer idle envs than ``--warm``, or retired envs not yet replaced."""
        if self.draining:
            return False
        return self._idle() < self.settings.warm or self._replacements > 0

    async def _yield_to_resets(self) -> None:
        """Let new sessions reset before starting an env (waits up to REFILL_DEFER_S).

        Starting a JVM takes a core for a second or more; on a small node it would slow down the
        very resets of the sessions that just took envs from the pool (a rollout batch creates
        and resets many sessions at once).
        """
        for _ in range(round(REFILL_DEFER_S / REFILL_POLL_S)):
            if not self._sessions_need_cpu():
                return
            await asyncio.sleep(REFILL_POLL_S)
