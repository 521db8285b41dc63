"""An ms-swift-shaped plugin env for the tests: guess a secret number in few replies.

Served as ``plugin:example_plugin_env:GuessNumberEnv`` (this folder on ``sys.path``).
Each step records the message history it was given (``last_messages``), so tests can check
what the server passes.
"""

from __future__ import annotations

import asyncio
import random
import re
from typing import Any, ClassVar


class GuessNumberEnv:
    score_scale = (0.0, 1.0)
    canary_action = "<guess>1</guess>"
    concurrent_steps = 0
    most_concurrent_steps = 0
    closed = 0
    last_messages: ClassVar[list[dict[str, Any]]] = []

    def __init__(self, env_config: dict[str, Any]) -> None:
        self.env_config = env_config
        self.high = int(env_config.get("high", 10))
        self.step_delay_s = float(env_config.get("step_delay_s", 0.0))
        self.secret = 0

    async def reset(self, request: Any) -> tuple[str, dict[str, Any], str]:
        data = request.data_dict
        seed = data["seed"] if data.get("seed") is not None else (data.get("data_idx") or 0)
        self.secret = random.Random(seed).randint(1, self.high)
        system = f"Guess my number between 1 and {self.high}. Answer as <guess>N</guess>."
        return "I picked a number.", {"high": self.high}, system

    async def step(self, messages: list[dict[str, Any]]) -> tuple[str, float, bool, dict[str, Any]]:
        cls = type(self)
        cls.concurrent_steps += 1
        cls.most_concurrent_steps = max(cls.most_concurrent_steps, cls.concurrent_steps)
        try:
            await asyncio.sleep(self.step_delay_s)
            cls.last_messages = [dict(message) for message in messages]
            match = re.search(r"<guess>(\d+)</guess>", messages[-1]["content"])
            if match is None:
                return "Answer as <guess>N</guess>.", 0.0, False, {"valid": False}
            guess = int(match.group(1))
            if guess == self.secret:
                return "Correct!", 1.0, True, {"valid": True}
            hint = "higher" if guess < self.secret else "lower"
            return f"No, go {hint}.", 0.0, False, {"valid": True}
        finally:
            cls.concurrent_steps -= 1

    async def close(self) -> None:
        type(self).closed += 1


class GuessNumberEnvOnce(GuessNumberEnv):
    """The same game from a plugin that says its instances must not serve a second session."""

    reusable = False


class GuessNumberEnvUnreplayable(GuessNumberEnv):
    """The same game from a plugin that says a lost episode must not be replayed."""

    replayable = False
