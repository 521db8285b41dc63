"""One env episode driven by replies: create, reset, step per reply, close.

Shared by the verl agent loop (replies come from the model) and the preflight runner (replies
come from a scripted policy), so both exercise the same client, templates and parser. Its
session is a `ReplayedSession`: one lost mid-episode is rebuilt on another server unseen.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import StrEnum
from types import TracebackType

from gymkube_agentloop.client import EnvCallError, EnvClient
from gymkube_agentloop.protocol import ScoreScale
from gymkube_agentloop.replay import ReplayedSession, ReplayStats
from gymkube_agentloop.templates import PromptTemplate

logger = logging.getLogger(__name__)

# Closing a session whose server is already gone must not hold up the trajectory.
LOST_CLOSE_DEADLINE_S = 0.0


class Ending(StrEnum):
    """Why an episode (trajectory) stopped."""

    DONE = "done"
    MAX_TURNS = "max_turns"
    RESPONSE_LENGTH = "response_length"
    ENV_LOST = "env_lost"
    ENV_ERROR = "env_error"
    BAD_INPUT = "bad_input"
    INTERNAL_ERROR = "internal_error"


@dataclass(frozen=True)
class Turn:
    """What the env said about one reply."""

    action: str
    observation: str
    done: bool
    ending: Ending | None = None
    """Set when the episode is over for a reason other than the env finishing it."""
    detail: str = ""


class EnvEpisode:
    """Async context manager; the session is closed on exit whatever happened."""

    def __init__(
        self,
        client: EnvClient,
        template: PromptTemplate,
        data_idx: int,
        score_scale: ScoreScale,
        seed: int | None = None,
    ) -> None:
        self.template = template
        self.data_idx = data_idx
        self.score_scale = score_scale
        self.session = ReplayedSession(client, data_idx, seed)
        self.score = 0.0
        self.best_score = 0.0
        self.steps = 0
        self.failure: Ending | None = None
        """ENV_LOST or ENV_ERROR once an env call failed for good."""

    async def __aenter__(self) -> EnvEpisode:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def start(self) -> Turn:
        """Create a session and reset it to the task; the turn's observation is the task message."""
        try:
            reply = await self.session.start()
        except EnvCallError as exc:
            return self._failed("", exc)
        self.score = self.best_score = reply.score
        message = self.template.task_message(reply.task_description, reply.observation)
        return Turn(action="", observation=message, done=reply.done)

    async def step(self, reply_text: str) -> Turn:
        """Send the action in a model reply; the turn's observation is the next user message."""
        action = self.template.parse_action(reply_text)
        self.steps += 1
        try:
            reply = await self.session.step(action)
        except EnvCallError as exc:
            if exc.status == 422:
                # The env rejected the action itself: tell the model, as an observation.
                message = self.template.observation_message(f"Invalid action: {exc.message}")
                return Turn(action=action, observation=message, done=False)
            if exc.status == 409:
                return Turn(action=action, observation="", done=True, detail=exc.message)
            return self._failed(action, exc)
        self.score = reply.score
        self.best_score = max(self.best_score, reply.score)
        message = self.template.observation_message(reply.observation)
        return Turn(action=action, observation=message, done=reply.done)

    @property
    def replays(self) -> ReplayStats:
        """Replays of its lost sessions so far."""
        return self.session.stats

    def reward(self, best: bool = False) -> float:
        """The episode's score normalised to 0..1 (final or best); 0 when the env failed."""
        if self.failure is not None:
            return 0.0
        return self.score_scale.normalise(self.best_score if best else self.score)

    async def close(self) -> None:
        deadline = LOST_CLOSE_DEADLINE_S if self.failure is Ending.ENV_LOST else None
        try:
            await self.session.close(deadline_s=deadline)
        except EnvCallError as exc:
            # The pool reaps sessions it does not hear from; a failed close only delays that.
            logger.warning("closing an env session of data_idx %d failed: %s", self.data_idx, exc)

    def _failed(self, action: str, exc: EnvCallError) -> Turn:
        self.failure = Ending.ENV_LOST if exc.session_gone else Ending.ENV_ERROR
        return Turn(action=action, observation="", done=True, ending=self.failure, detail=str(exc))
