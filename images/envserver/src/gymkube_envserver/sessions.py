"""Sessions, the warm pool, capacity, idle reaping and draining: everything between HTTP and env."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
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


@dataclass(eq=False)
class Session:
    id: str
    instance: EnvInstance
    env_config: dict[str, Any]
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


def describe_failure(exc: BaseException) -> str:
    text = str(exc).strip() or "no message"
    return f"{type(exc).__name__}: {text[:500]}"


class SessionManager:
    """Owns every env instance: open sessions and the warm pool of pre-started ones."""

    def __init__(self, backend: EnvBackend, settings: ServerSettings) -> None:
        self.backend = backend
        self.settings = settings
        self.sessions: dict[str, Session] = {}
        self.warm: deque[EnvInstance] = deque()
        self.served = 0
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
        for session_id in list(self.sessions):
            self._begin_close(session_id, "server shut down")
        while self.warm:
            self._spawn_close(self.warm.popleft())
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
            instance = await self._take_instance(env_config)
        finally:
            self._creating -= 1
        session = Session(id=secrets.token_hex(8), instance=instance, env_config=env_config)
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
        """Close a session; True when it was open. Idempotent: unknown ids are not an error."""
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
            self._begin_close(session.id, f"lost: its env did not answer within {timeout:g} s")
            raise ApiError(
                ErrorCode.SESSION_LOST,
                f"session {session.id!r} closed: its env did not answer within {timeout:g} s",
            ) from None
        except EnvInputError as exc:
            raise ApiError(ErrorCode.BAD_REQUEST, str(exc)) from None
        except EnvLostError as exc:
            self._begin_close(session.id, "lost: its env died")
            raise ApiError(
                ErrorCode.SESSION_LOST, f"session {session.id!r} lost its env: {exc}"
            ) from None
        except Exception as exc:
            log.exception("env call failed for session %s", session.id)
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
        if session is not None:
            self._count_episode(session)
            # Wait for any call in flight on this session, then free its env in the background.
            self._spawn_close(session.instance, session.lock)

    def _spawn_close(self, instance: EnvInstance, lock: asyncio.Lock | None = None) -> None:
        async def close() -> None:
            if lock is None:
                await instance.close()
                return
            async with lock:
                await instance.close()

        task = asyncio.create_task(close(), name="close-env")
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
        self._refill.set()

    async def _take_instance(self, env_config: dict[str, Any]) -> EnvInstance:
        # Warm envs were started with the server's default env_config.
        keeps_default = env_config == self.settings.env_config
        if self.warm and (self.backend.config_at_reset or keeps_default):
            instance = self.warm.popleft()
            self._refill.set()
            return instance
        try:
            return await self.backend.start(env_config)
        except EnvInputError as exc:
            raise ApiError(ErrorCode.BAD_REQUEST, str(exc)) from None
        except Exception as exc:
            log.exception("starting an env failed")
            raise ApiError(ErrorCode.ENV_FAILURE, describe_failure(exc)) from None

    @contextlib.asynccontextmanager
    async def borrowed_spare(self) -> AsyncIterator[EnvInstance]:
        """A started env outside any session, for the canary.

        A warm env used without error goes back to the warm pool (a canary then costs no env
        start, which for ScienceWorld is a JVM and its warm-up); any other is closed.
        """
        from_pool = bool(self.warm)
        if from_pool:
            instance = self.warm.popleft()
            self._lent += 1
        else:
            instance = await self.backend.start(self.settings.env_config)
        try:
            yield instance
        except BaseException:
            self._spawn_close(instance)
            raise
        finally:
            if from_pool:
                self._lent -= 1
        if from_pool and not self.draining and len(self.warm) < self.settings.warm:
            self.warm.append(instance)
        else:
            self._spawn_close(instance)

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
                instance: EnvInstance | None = None
                try:
                    instance = await self.backend.start(self.settings.env_config)
                    await instance.warm_up()
                except Exception:
                    log.exception("starting a warm env failed; retrying")
                    if instance is not None:
                        self._spawn_close(instance)
                    await asyncio.sleep(WARM_RETRY_S)
                    continue
                self.warm.append(instance)
            if len(self.warm) + self._lent >= self.settings.warm:
                self.warmed_event.set()
            self._refill.clear()
            await self._refill.wait()

    def _warm_pool_short(self) -> bool:
        """Fewer warm envs than wanted, counting one the canary has borrowed."""
        return not self.draining and len(self.warm) + self._lent < self.settings.warm

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
