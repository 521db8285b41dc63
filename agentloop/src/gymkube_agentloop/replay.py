"""An episode's env session that outlives its server: a lost session is rebuilt on another one.

When an episode's session is lost (its server died, froze or forgot it), `ReplayedSession` opens a
new session through the same URL (a pool's router places it on a live server) with the same
`env_config`, resets it to the same task, replays the actions the lost session had answered, in
order, and checks every replayed answer against a hash of the one the episode saw: the determinism
canary. Only then is the action that was in flight sent again, so the caller gets the answer it
was waiting for.

It gives up, raising `ReplayFailed` (a lost session, saying why), when replay is turned off, the
env's `/tasks` does not declare it replayable, a canary differs, or the episode has used its
`ReplaySettings.max_replays` or `budget_s`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from gymkube_agentloop.client import EnvCallError, EnvClient, EnvSessionLost, fetch_tasks
from gymkube_agentloop.protocol import ResetReply, StepReply

logger = logging.getLogger(__name__)

REJECTED = "rejected"
"""The canary of an action the env refused (422): replayed, it must be refused again."""


def canary(reply: StepReply) -> str:
    """The determinism canary of an env answer: sha256 of the env's own text and its score."""
    task_description = reply.task_description if isinstance(reply, ResetReply) else ""
    text = json.dumps([task_description, reply.observation, reply.score])
    return hashlib.sha256(text.encode()).hexdigest()


class ReplayFailed(EnvSessionLost):
    """The session was lost and its episode could not be rebuilt; the message says why."""

    def __init__(self, message: str) -> None:
        super().__init__("replay_failed", message)


class _CanaryDiffered(Exception):
    """A replayed answer differs from the one the episode saw (the argument says where)."""


@dataclass
class ReplayStats:
    """What rebuilding lost sessions cost one episode."""

    replays: int = 0
    """Replays started: sessions opened to rebuild the episode after a loss."""
    canary_failures: int = 0
    """Replays given up because a replayed answer differed from the one seen."""
    seconds: float = 0.0
    """Time spent in replays."""


@dataclass(frozen=True)
class _Answered:
    action: str
    canary: str


class ReplayedSession:
    """One episode's session (`start`, `step`, `close`), rebuilt elsewhere whenever it is lost."""

    def __init__(
        self,
        client: EnvClient,
        data_idx: int,
        seed: int | None = None,
        env_config: dict[str, Any] | None = None,
    ) -> None:
        self.client = client
        self.data_idx = data_idx
        self.seed = seed
        self.env_config = env_config
        self.session_id: str | None = None
        self.stats = ReplayStats()
        self._reset_canary: str | None = None
        self._answered: list[_Answered] = []

    async def start(self) -> ResetReply:
        """Open a session and reset it to the task."""
        self.session_id = await self.client.create(self.env_config)
        try:
            reply = await self.client.reset(self.session_id, self.data_idx, self.seed)
        except EnvCallError as exc:
            if not exc.session_gone:
                raise
            # Lost before the episode saw anything: the replay is a fresh start elsewhere.
            return await self._replay(exc)
        self._reset_canary = canary(reply)
        return reply

    async def step(self, action: str) -> StepReply:
        """Send one action; a lost session is rebuilt and the action sent again there."""
        if self.session_id is None:
            raise RuntimeError("step() before a successful start()")
        try:
            reply = await self.client.step(self.session_id, action)
        except EnvCallError as exc:
            if exc.status == 422:
                self._answered.append(_Answered(action, REJECTED))
                raise
            if not exc.session_gone:
                raise
            await self._replay(exc)
            return await self.step(action)
        self._answered.append(_Answered(action, canary(reply)))
        return reply

    async def close(self, deadline_s: float | None = None) -> None:
        if self.session_id is None:
            return
        session_id, self.session_id = self.session_id, None
        await self.client.close(session_id, deadline_s=deadline_s)

    async def _replay(self, lost: EnvCallError) -> ResetReply:
        """Rebuild the episode on a new session: its reset answer, or ReplayFailed."""
        settings = self.client.settings.replay
        if not settings.enabled:
            raise lost
        stats = self.stats
        if stats.seconds >= settings.budget_s:
            raise self._no_replay_left(lost)
        began = time.monotonic()
        try:
            async with asyncio.timeout(settings.budget_s - stats.seconds):
                return await self._replay_until_rebuilt(lost)
        except TimeoutError:
            raise ReplayFailed(
                f"replay ran past its budget of {settings.budget_s:g}s; "
                f"the session was lost: {lost}"
            ) from None
        finally:
            stats.seconds += time.monotonic() - began

    async def _replay_until_rebuilt(self, lost: EnvCallError) -> ResetReply:
        try:
            tasks = await fetch_tasks(self.client.base_url, self.client.settings)
        except EnvCallError as exc:
            raise ReplayFailed(f"replay impossible ({exc}); the session was lost: {lost}") from None
        if not tasks.replayable:
            raise ReplayFailed(f"env {tasks.env} is not replayable; the session was lost: {lost}")
        while True:
            if self.stats.replays >= self.client.settings.replay.max_replays:
                raise self._no_replay_left(lost)
            self.stats.replays += 1
            logger.info(
                "env session %s lost (%s): replaying %d actions of data_idx %d on a new session",
                self.session_id,
                lost,
                len(self._answered),
                self.data_idx,
            )
            try:
                return await self._rebuild()
            except _CanaryDiffered as differed:
                self.stats.canary_failures += 1
                raise ReplayFailed(
                    f"replay canary differed at {differed}; the session was lost: {lost}"
                ) from None
            except EnvCallError as exc:
                if not exc.session_gone:
                    message = f"replay failed: {exc}; the session was lost: {lost}"
                    raise ReplayFailed(message) from None
                lost = exc

    def _no_replay_left(self, lost: EnvCallError) -> ReplayFailed:
        settings, stats = self.client.settings.replay, self.stats
        return ReplayFailed(
            f"no replay left ({stats.replays} in {stats.seconds:.1f}s; max_replays "
            f"{settings.max_replays}, budget_s {settings.budget_s:g}); the session was lost: {lost}"
        )

    async def _rebuild(self) -> ResetReply:
        """A new session brought to where the lost one was, each answer checked on the way."""
        # The lost session is not closed: its server is gone, frozen or has forgotten it, and one
        # that lives on reaps it when idle.
        self.session_id = await self.client.create(self.env_config)
        reply = await self.client.reset(self.session_id, self.data_idx, self.seed, replay=True)
        replayed = canary(reply)
        if self._reset_canary is not None and replayed != self._reset_canary:
            raise _CanaryDiffered("the reset")
        self._reset_canary = replayed
        for number, answered in enumerate(self._answered, 1):
            try:
                replayed = canary(await self.client.step(self.session_id, answered.action))
            except EnvCallError as exc:
                if exc.status != 422:
                    raise
                replayed = REJECTED
            if replayed != answered.canary:
                raise _CanaryDiffered(f"step {number}")
        return reply
