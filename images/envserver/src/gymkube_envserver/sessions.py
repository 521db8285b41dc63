"""Sessions, capacity, idle reaping and draining: everything between HTTP and the env pool.

A session borrows an env from the pool (``env_pool``) at /create and gives it back when it ends;
the pool decides whether the env serves again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Awaitable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from gymkube_envserver.env_pool import (
    REFILL_DEFER_S,
    EnvPool,
    EnvRetired,
    PooledEnv,
    describe_failure,
)
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
SHUTDOWN_CLOSE_S = 20.0


@dataclass(eq=False)
class Session:
    id: str
    env: PooledEnv
    """The pool's env it plays on (traded for a fresh one at a reset once due for recycling)."""
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


class SessionManager:
    """Owns the sessions and the env pool (``pool``) they borrow envs from."""

    def __init__(self, backend: EnvBackend, settings: ServerSettings) -> None:
        self.backend = backend
        self.settings = settings
        self.sessions: dict[str, Session] = {}
        self.pool = EnvPool(backend, settings, self._sessions_need_cpu)
        self.served = 0
        self.envs_reused = 0
        """Sessions that got an env an earlier session had given back."""
        # Episodes that ended (the session was reset again or closed) and the sum of their last
        # scores, in the env's scale: what a trainer's rewards can be checked against.
        self.episodes_played = 0
        self.episode_score_sum = 0.0
        self.replays = 0
        """Resets a client marked as replays: lost episodes rebuilt on this server."""
        self._closed: OrderedDict[str, str] = OrderedDict()
        self._creating = 0
        self._resets_in_flight = 0
        self._tasks: list[asyncio.Task[None]] = []

    # what the app, metrics and canary read of the pool

    @property
    def warm(self) -> deque[PooledEnv]:
        """Idle started envs, oldest first."""
        return self.pool.warm

    @property
    def envs_started(self) -> int:
        return self.pool.envs_started

    @property
    def envs_retired(self) -> Counter[EnvRetired]:
        return self.pool.envs_retired

    @property
    def draining(self) -> bool:
        return self.pool.draining

    @property
    def prepared(self) -> bool:
        return self.pool.prepared

    @property
    def warmed_event(self) -> asyncio.Event:
        return self.pool.warmed_event

    def borrowed_spare(self) -> AbstractAsyncContextManager[EnvInstance]:
        """A started env outside any session, for the canary (see EnvPool.borrowed_spare)."""
        return self.pool.borrowed_spare()

    # lifecycle

    async def start(self) -> None:
        """Prepare the backend and begin filling the warm pool (readiness follows)."""
        self._tasks.append(asyncio.create_task(self.pool.prepare_and_fill(), name="warm-pool"))
        if self.settings.idle_timeout > 0:
            self._tasks.append(asyncio.create_task(self._reap_idle(), name="idle-reaper"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        self.pool.draining = True  # envs of the sessions closed now are not put back
        for session_id in list(self.sessions):
            self._begin_close(session_id, "server shut down")
        await self.pool.close_all(SHUTDOWN_CLOSE_S)
        await self.backend.shutdown()

    @property
    def active(self) -> int:
        """Open sessions and those being created: what counts against max_sessions, and what
        /status reports, so a router polling mid-create does not see a slot that is taken."""
        return len(self.sessions) + self._creating

    @property
    def ready(self) -> bool:
        return self.prepared and self.pool.warmed and not self.draining

    @property
    def not_ready_reason(self) -> str:
        if self.draining:
            return "draining"
        if not self.prepared:
            return "preparing env"
        if not self.pool.warmed:
            return f"warming up ({len(self.warm)}/{self.settings.warm} envs started)"
        return "ready"

    def set_draining(self, draining: bool) -> None:
        self.pool.set_draining(draining)

    # sessions

    def refusal(self) -> ApiError | None:
        """Why a new session would be refused now, or None when one would be taken."""
        retry = self.settings.retry_after
        if self.draining:
            return ApiError(ErrorCode.DRAINING, "server is draining; use another", retry)
        if not self.prepared:
            return ApiError(ErrorCode.NOT_READY, "the env is still starting", retry)
        if self.active >= self.settings.max_sessions:
            return ApiError(
                ErrorCode.AT_CAPACITY,
                f"all {self.settings.max_sessions} sessions are in use; retry later",
                retry,
            )
        return None

    async def create(self, env_config: dict[str, Any]) -> Session:
        """A new session whose env_config is ``env_config`` over the server's default."""
        refusal = self.refusal()
        if refusal is not None:
            raise refusal
        env_config = {**self.settings.env_config, **env_config}
        try:
            self.backend.check_config(env_config)
        except EnvInputError as exc:
            raise ApiError(ErrorCode.BAD_REQUEST, str(exc)) from None
        self._creating += 1
        try:
            env = await self.pool.take_idle_or_returning(env_config)
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

    async def reset(
        self, session_id: str, params: ResetParams, replay: bool = False
    ) -> tuple[Session, ResetOutcome]:
        """Start an episode; ``replay`` marks one a client rebuilds after losing its session."""
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
            self._swap_if_due_for_recycling(session)
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
            self.replays += replay
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

    async def _start_for_session(self, env_config: dict[str, Any]) -> PooledEnv:
        try:
            return await self.pool.start_for_session(env_config)
        except EnvInputError as exc:
            raise ApiError(ErrorCode.BAD_REQUEST, str(exc)) from None
        except Exception as exc:
            log.exception("starting an env failed")
            raise ApiError(ErrorCode.ENV_FAILURE, describe_failure(exc)) from None

    def _swap_if_due_for_recycling(self, session: Session) -> None:
        """At an episode boundary, trade an env that reached a recycling bound for an idle one.

        A session may play many episodes (an OpenEnv connection can last for days): the bounds
        hold for it too, not only when it ends. With no idle env it keeps its env until it ends.
        """
        fresh = self.pool.trade(session.env, session.env_config)
        if fresh is not None:
            fresh.sessions += 1
            session.env = fresh

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
            self.pool.give_back(session.env)
            return

        # A call is in flight on this session: its env is settled once that call is over.
        async def after_call() -> None:
            async with session.lock:
                self.pool.give_back(session.env)

        self.pool.track(asyncio.create_task(after_call(), name="give-back-env"))

    def _sessions_need_cpu(self) -> bool:
        """Sessions are resetting, or were created in the last REFILL_DEFER_S and not reset yet."""
        if self._resets_in_flight:
            return True
        recent = time.time() - REFILL_DEFER_S
        return any(
            not session.started and session.created_at > recent
            for session in self.sessions.values()
        )

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
