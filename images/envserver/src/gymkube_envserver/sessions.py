"""Sessions, the env pool, capacity, idle reaping and draining: everything between HTTP and env.

An env outlives its session: a clean close puts it back in the pool for the next /create (whose
/reset loads that session's task), and only an env that failed, served its episode quota or grew
past the memory bound is closed. The pool thus holds all idle capacity, not only ``--warm`` envs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections import Counter, OrderedDict, deque
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar

from gymkube_envserver.envs.base import (
    EnvBackend,
    EnvInputError,
    EnvInstance,
    EnvLostError,
    ResetOutcome,
    ResetParams,
    StepOutcome,
)
from gymkube_envserver.errors import ApiError
from gymkube_envserver.settings import ServerSettings
from gymkube_envserver.wire import ErrorCode

log = logging.getLogger(__name__)
T = TypeVar("T")

CLOSED_IDS_KEPT = 10_000
"""How many closed ids are remembered, so their errors say "closed" rather than "unknown"."""
WARM_RETRY_S = 2.0
SHUTDOWN_CLOSE_S = 20.0
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


RECYCLED = frozenset({EnvRetired.EPISODES, EnvRetired.MEMORY})
"""Retirements of healthy, reusable envs: the pool starts a replacement in the background."""


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


@dataclass(eq=False)
class Session:
    id: str
    env: PooledEnv
    env_config: dict[str, Any]
    reused: bool = False
    """Its env had served an earlier session."""
    created_at: float = field(default_factory=time.time)
    last_active_at: float = field(default_factory=time.time)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    started: bool = False
    done: bool = False
    data_idx: int | None = None
    task_description: str | None = None
    observation: str | None = None
    reward: float = 0.0
    score: float = 0.0
    steps: int = 0
    episodes: int = 0
    info: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def record(self, outcome: StepOutcome) -> None:
        self.observation = outcome.observation
        self.reward = outcome.reward
        self.score = outcome.score
        self.done = outcome.done
        self.info = outcome.info

    @property
    def instance(self) -> EnvInstance:
        return self.env.instance


def describe_failure(exc: BaseException) -> str:
    text = str(exc).strip() or "no message"
    return f"{type(exc).__name__}: {text[:500]}"


class SessionManager:
    """Owns every env: those open sessions hold and the pool of idle ones (``warm``)."""

    def __init__(self, backend: EnvBackend, settings: ServerSettings) -> None:
        self.backend = backend
        self.settings = settings
        self.sessions: dict[str, Session] = {}
        self.warm: deque[PooledEnv] = deque()
        """Idle started envs, oldest first: pre-started ones and those sessions gave back."""
        self.served = 0
        self.envs_started = 0
        self.envs_reused = 0
        """Sessions that got an env an earlier session had given back."""
        self.envs_retired: Counter[EnvRetired] = Counter()
        # Episodes that ended (the session was reset again or closed) and the sum of their last
        # scores, in the env's scale: what a trainer's rewards can be checked against.
        self.episodes_played = 0
        self.episode_score_sum = 0.0
        self.draining = False
        self.prepared = False
        self.warmed_event = asyncio.Event()
        self._closed: OrderedDict[str, str] = OrderedDict()
        self._creating = 0
        self._lent = 0  # warm envs the canary has borrowed (they come back)
        self._refill = asyncio.Event()
        self._resets_in_flight = 0
        self._replacements = 0  # recycled envs the pool still has to replace
        self._warming = 0  # given-back envs warming up before they rejoin the pool
        self._returned = asyncio.Event()  # set (and replaced) whenever an env may have come back
        self._tasks: list[asyncio.Task[None]] = []
        self._closing: set[asyncio.Task[None]] = set()

    # lifecycle

    async def start(self) -> None:
        """Prepare the backend and begin filling the warm pool (readiness follows)."""
        self._tasks.append(asyncio.create_task(self._prepare_and_fill(), name="warm-pool"))
        if self.settings.idle_timeout > 0:
            self._tasks.append(asyncio.create_task(self._reap_idle(), name="idle-reaper"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        self.draining = True  # envs of the sessions closed now are not put back
        for session_id in list(self.sessions):
            self._begin_close(session_id, "server shut down")
        while self.warm:
            self._retire(self.warm.popleft(), EnvRetired.DRAINING)
        if self._closing:
            # A hung env call holds its session's lock; do not let it hold up the shutdown.
            await asyncio.wait(set(self._closing), timeout=SHUTDOWN_CLOSE_S)
        await self.backend.shutdown()

    @property
    def ready(self) -> bool:
        return self.prepared and self.warmed and not self.draining

    @property
    def warmed(self) -> bool:
        """The warm pool has been full at least once."""
        return self.warmed_event.is_set()

    @property
    def not_ready_reason(self) -> str:
        if self.draining:
            return "draining"
        if not self.prepared:
            return "preparing env"
        if not self.warmed:
            return f"warming up ({len(self.warm)}/{self.settings.warm} envs started)"
        return "ready"

    def set_draining(self, draining: bool) -> None:
        self.draining = draining
        if not draining:
            self._refill.set()

    # sessions

    async def create(self, env_config: dict[str, Any]) -> Session:
        """A new session whose env_config is ``env_config`` over the server's default."""
        retry = self.settings.retry_after
        if self.draining:
            raise ApiError(ErrorCode.DRAINING, "server is draining; use another", retry)
        if not self.prepared:
            raise ApiError(ErrorCode.NOT_READY, "the env is still starting", retry)
        if len(self.sessions) + self._creating >= self.settings.max_sessions:
            raise ApiError(
                ErrorCode.AT_CAPACITY,
                f"all {self.settings.max_sessions} sessions are in use; retry later",
                retry,
            )
        env_config = {**self.settings.env_config, **env_config}
        try:
            self.backend.check_config(env_config)
        except EnvInputError as exc:
            raise ApiError(ErrorCode.BAD_REQUEST, str(exc)) from None
        self._creating += 1
        try:
            env = await self._take_idle_or_returning(env_config)
            if env is None:
                env = await self._start_for_session(env_config)
        finally:
            self._creating -= 1
        session = Session(
            id=secrets.token_hex(8), env=env, env_config=env_config, reused=env.sessions > 0
        )
        env.sessions += 1
        self.envs_reused += session.reused
        self.sessions[session.id] = session
        self.served += 1
        return session

    def get(self, session_id: str) -> Session:
        session = self.sessions.get(session_id)
        if session is not None:
            return session
        reason = self._closed.get(session_id)
        if reason is None:
            raise ApiError(ErrorCode.SESSION_NOT_FOUND, f"no session {session_id!r} on this server")
        raise ApiError(ErrorCode.SESSION_NOT_FOUND, f"session {session_id!r} is {reason}")

    async def reset(self, session_id: str, params: ResetParams) -> tuple[Session, ResetOutcome]:
        session = self.get(session_id)
        if params.data_idx is not None:
            try:
                self.backend.check_data_idx(params.data_idx)
            except EnvInputError as exc:
                raise ApiError(ErrorCode.BAD_REQUEST, str(exc)) from None
        merged = ResetParams(
            data_idx=params.data_idx,
            seed=params.seed,
            env_config={**session.env_config, **params.env_config},
        )
        async with session.lock:
            self._still_open(session)
            self._resets_in_flight += 1
            try:
                outcome = await self._call(session, session.instance.reset(merged))
            finally:
                self._resets_in_flight -= 1
            session.env.episodes += 1
            self._count_episode(session)
            session.record(outcome)
            session.started = True
            session.data_idx = params.data_idx
            session.task_description = outcome.task_description
            session.extra = outcome.extra
            session.steps = 0
            session.episodes += 1
            session.last_active_at = time.time()
        return session, outcome

    async def step(self, session_id: str, action: str) -> StepOutcome:
        session = self.get(session_id)
        async with session.lock:
            self._still_open(session)
            if not session.started:
                raise ApiError(
                    ErrorCode.EPISODE_NOT_STARTED, f"session {session_id!r} needs /reset first"
                )
            if session.done:
                raise ApiError(
                    ErrorCode.EPISODE_FINISHED,
                    f"the episode of session {session_id!r} has finished; /reset starts another",
                )
            outcome = await self._call(session, session.instance.step(action))
            session.record(outcome)
            session.steps += 1
            session.last_active_at = time.time()
        return outcome

    def close(self, session_id: str) -> bool:
        """Close a session; True when it was open. Idempotent: unknown ids are not an error.

        Its env goes back to the pool unless it failed or is due for recycling."""
        if session_id not in self.sessions:
            return False
        self._begin_close(session_id, "closed")
        return True

    # internals

    def _still_open(self, session: Session) -> None:
        # A close may land while this call waited for the session's lock.
        if self.sessions.get(session.id) is not session:
            self.get(session.id)

    async def _call(self, session: Session, call: Awaitable[T]) -> T:
        timeout = self.settings.call_timeout
        try:
            # asyncio.timeout, unlike wait_for, adds no task per call (it is on every step).
            async with asyncio.timeout(timeout):
                return await call
        except TimeoutError:
            session.env.failed = f"no answer within {timeout:g} s"
            self._begin_close(session.id, f"lost: its env did not answer within {timeout:g} s")
            raise ApiError(
                ErrorCode.SESSION_LOST,
                f"session {session.id!r} closed: its env did not answer within {timeout:g} s",
            ) from None
        except EnvInputError as exc:
            raise ApiError(ErrorCode.BAD_REQUEST, str(exc)) from None
        except EnvLostError as exc:
            session.env.failed = f"died: {exc}"
            self._begin_close(session.id, "lost: its env died")
            raise ApiError(
                ErrorCode.SESSION_LOST, f"session {session.id!r} lost its env: {exc}"
            ) from None
        except Exception as exc:
            log.exception("env call failed for session %s", session.id)
            # The session stays usable, but whatever the failure left behind must not reach
            # another session: this env is closed when the session ends.
            session.env.failed = describe_failure(exc)
            raise ApiError(ErrorCode.ENV_FAILURE, describe_failure(exc)) from None

    def _count_episode(self, session: Session) -> None:
        """The session's episode so far is over: count it with its last score."""
        if session.started:
            self.episodes_played += 1
            self.episode_score_sum += session.score

    def _begin_close(self, session_id: str, reason: str) -> None:
        session = self.sessions.pop(session_id, None)
        self._closed[session_id] = reason
        while len(self._closed) > CLOSED_IDS_KEPT:
            self._closed.popitem(last=False)
        if session is None:
            return
        self._count_episode(session)
        if not session.lock.locked():
            self._give_back(session.env)
            return

        # A call is in flight on this session: its env is settled once that call is over.
        async def after_call() -> None:
            async with session.lock:
                self._give_back(session.env)

        self._track(asyncio.create_task(after_call(), name="give-back-env"))

    def _give_back(self, env: PooledEnv, from_session: bool = True) -> None:
        """An env no session or canary uses any more: back to the pool, or closed and why."""
        reason = self._retire_reason(env, from_session)
        if reason is None and not env.warmed and env.instance.warms_up():
            self._warming += 1  # counted now: a /create may come before the task runs
            self._track(asyncio.create_task(self._warm_up_and_give_back(env), name="warm-up-env"))
            return
        if reason is None:
            self.warm.append(env)
            self._announce_return()
            return
        if reason in RECYCLED:
            self._replacements += 1
        self._retire(env, reason)

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
        self._give_back(env)
        self._announce_return()

    def _announce_return(self) -> None:
        self._returned.set()
        self._returned = asyncio.Event()

    async def _take_idle_or_returning(self, env_config: dict[str, Any]) -> PooledEnv | None:
        """An idle env, waiting for one that is warming up on its way back if need be: it is
        ready sooner than a new one, and a new one would grow the pool past its size."""
        env = self._take_idle(env_config)
        while env is None and self._warming:
            await self._returned.wait()
            env = self._take_idle(env_config)
        return env

    def _retire_reason(self, env: PooledEnv, from_session: bool) -> EnvRetired | None:
        if env.failed is not None:
            return EnvRetired.FAILED
        if self.draining:
            return EnvRetired.DRAINING
        # --reuse is about sessions: the canary's idle env goes back either way, as it always did.
        if not self.backend.reusable or (from_session and not self.settings.reuse):
            return EnvRetired.NOT_REUSED
        quota = self.settings.recycle_after_episodes
        if quota and env.episodes >= quota:
            return EnvRetired.EPISODES
        bound = self.settings.recycle_rss_mib
        rss = env.instance.rss_bytes() if bound else None
        if rss is not None and rss > bound * MIB:
            return EnvRetired.MEMORY
        return None

    def _retire(self, env: PooledEnv, reason: EnvRetired) -> None:
        """Close the env in the background and let the pool refill."""
        self.envs_retired[reason] += 1
        log.debug("closing an env (%s) after %d episodes", reason.value, env.episodes)
        self._track(asyncio.create_task(env.instance.close(), name="close-env"))
        self._refill.set()

    def _track(self, task: asyncio.Task[None]) -> None:
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def _take_idle(self, env_config: dict[str, Any]) -> PooledEnv | None:
        """The oldest idle env that can serve a session with ``env_config``, out of the pool."""
        for env in self.warm:
            # Plugins take env_config in their constructor; every built-in env at reset.
            if self.backend.config_at_reset or env.env_config == env_config:
                self.warm.remove(env)
                self._refill.set()
                return env
        return None

    async def _start_env(self, env_config: dict[str, Any]) -> PooledEnv:
        instance = await self.backend.start(env_config)
        self.envs_started += 1
        return PooledEnv(instance=instance, env_config=env_config)

    async def _start_for_session(self, env_config: dict[str, Any]) -> PooledEnv:
        # This env also stands in for one the pool owed in place of a recycled env.
        self._replacements = max(0, self._replacements - 1)
        try:
            return await self._start_env(env_config)
        except EnvInputError as exc:
            raise ApiError(ErrorCode.BAD_REQUEST, str(exc)) from None
        except Exception as exc:
            log.exception("starting an env failed")
            raise ApiError(ErrorCode.ENV_FAILURE, describe_failure(exc)) from None

    @contextlib.asynccontextmanager
    async def borrowed_spare(self) -> AsyncIterator[EnvInstance]:
        """A started env outside any session, for the canary.

        An idle env used without error goes back to the pool (a canary then costs no env
        start, which for ScienceWorld is a JVM and its warm-up); any other is closed.
        """
        env = self._take_idle(self.settings.env_config)
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
                self._give_back(env, from_session=False)
            else:
                # Started for the canary alone: not idle capacity the pool should keep.
                failed = env.failed is not None
                self._retire(env, EnvRetired.FAILED if failed else EnvRetired.NOT_REUSED)

    async def _prepare_and_fill(self) -> None:
        while not self.prepared:
            try:
                await self.backend.prepare()
                self.prepared = True
            except Exception:
                log.exception("preparing the env failed; retrying")
                await asyncio.sleep(WARM_RETRY_S)
        while True:
            while self._warm_pool_short():
                await self._yield_to_resets()
                if not self._warm_pool_short():
                    break  # a canary gave its env back meanwhile
                env: PooledEnv | None = None
                try:
                    env = await self._start_env(self.settings.env_config)
                    await env.instance.warm_up()
                except Exception:
                    log.exception("starting a warm env failed; retrying")
                    if env is not None:
                        env.failed = "its warm-up failed"
                        self._retire(env, EnvRetired.FAILED)
                    await asyncio.sleep(WARM_RETRY_S)
                    continue
                env.warmed = True
                if len(self.warm) + self._lent + self._warming >= self.settings.warm:
                    self._replacements = max(0, self._replacements - 1)
                self.warm.append(env)
                self._announce_return()
            if len(self.warm) + self._lent >= self.settings.warm:
                self.warmed_event.set()
            self._refill.clear()
            await self._refill.wait()

    def _warm_pool_short(self) -> bool:
        """Fewer idle envs than ``--warm`` (counting those the canary has borrowed or that are
        warming up on their way back), or recycled envs not yet replaced."""
        if self.draining:
            return False
        idle = len(self.warm) + self._lent + self._warming
        return idle < self.settings.warm or self._replacements > 0

    async def _yield_to_resets(self) -> None:
        """Let new sessions reset before starting an env (waits up to REFILL_DEFER_S).

        Starting a JVM takes a core for a second or more; on a small node it would slow down the
        very resets of the sessions that just took envs from the pool (a rollout batch creates
        and resets many sessions at once).
        """
        for _ in range(round(REFILL_DEFER_S / REFILL_POLL_S)):
            recent = time.time() - REFILL_DEFER_S
            awaiting_reset = any(
                not session.started and session.created_at > recent
                for session in self.sessions.values()
            )
            if not (self._resets_in_flight or awaiting_reset):
                return
            await asyncio.sleep(REFILL_POLL_S)

    async def _reap_idle(self) -> None:
        timeout = self.settings.idle_timeout
        period = min(max(timeout / 4, 0.05), 5.0)
        while True:
            await asyncio.sleep(period)
            cutoff = time.time() - timeout
            for session in list(self.sessions.values()):
                if session.last_active_at < cutoff and not session.lock.locked():
                    log.info("closing session %s: idle for over %.0f s", session.id, timeout)
                    self._begin_close(session.id, f"expired (idle over {timeout:g} s)")
